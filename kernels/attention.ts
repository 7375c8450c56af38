import type { ModelConfig } from "../lib/model_config.ts";
import { bindAll, type Gpu } from "./device.ts";
import { DIM_ROWS, WGSL_STEP_TYPES } from "./step_meta.ts";

const TILE = 32;

/**
 * WGSL for paged causal attention, one workgroup per (row, query head): the row at position p
 * attends to positions 0..p of its sequence, reading K/V through the sequence's block table
 * (a prefill chunk's own rows were stored by the preceding rope+store dispatch). Keys go in
 * tiles of 32 with an online softmax; each tile's max and sum are taken in a fixed order, so a
 * row's output depends only on its own sequence, never on the rest of the batch.
 */
export function attentionWgsl(config: ModelConfig, blockSize: number): string {
  const { nHeads, nKvHeads, headDim } = config;
  const qDim = nHeads * headDim;
  const kvDim = nKvHeads * headDim;
  const nAcc = Math.ceil(headDim / TILE);
  return /* wgsl */ `
${WGSL_STEP_TYPES}
@group(0) @binding(0) var<uniform> dims: vec4<u32>;
@group(0) @binding(1) var<storage, read> rows: array<Row>;
@group(0) @binding(2) var<storage, read> seqs: array<Seq>;
@group(0) @binding(3) var<storage, read> tables: array<u32>;
@group(0) @binding(4) var<storage, read> Q: array<f32>;
@group(0) @binding(5) var<storage, read> Kc: array<f32>;
@group(0) @binding(6) var<storage, read> Vc: array<f32>;
@group(0) @binding(7) var<storage, read_write> O: array<f32>;
const HD = ${headDim}u;
const TILE = ${TILE}u;
const NACC = ${nAcc}u;
const SCALE = ${1 / Math.sqrt(headDim)};
var<workgroup> qs: array<f32, ${headDim}>;
var<workgroup> scores: array<f32, ${TILE}>;
var<workgroup> probs: array<f32, ${TILE}>;
var<workgroup> slots: array<u32, ${TILE}>;
@compute @workgroup_size(${TILE})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let r = wg.y;
  let h = wg.x;
  if (r >= dims[${DIM_ROWS}]) { return; }
  let row = rows[r];
  let seq = seqs[row.seq];
  let kvBase = (h / ${nHeads / nKvHeads}u) * HD;
  for (var d = t; d < HD; d += TILE) { qs[d] = Q[r * ${qDim}u + h * HD + d]; }
  workgroupBarrier();
  let n = row.pos + 1u;
  var m = 0.0;
  var l = 0.0;
  var acc: array<f32, NACC>;
  for (var t0 = 0u; t0 < n; t0 += TILE) {
    let k = t0 + t;
    if (k < n) {
      let slot = tables[seq.tableOffset + k / ${blockSize}u] * ${blockSize}u + k % ${blockSize}u;
      slots[t] = slot;
      let kb = slot * ${kvDim}u + kvBase;
      var dot = 0.0;
      for (var d = 0u; d < HD; d++) { dot += qs[d] * Kc[kb + d]; }
      scores[t] = dot * SCALE;
    }
    workgroupBarrier();
    let count = min(TILE, n - t0);
    var tileMax = scores[0];
    for (var i = 1u; i < count; i++) { tileMax = max(tileMax, scores[i]); }
    let mNew = select(tileMax, max(m, tileMax), t0 > 0u);
    let correction = select(0.0, exp(m - mNew), t0 > 0u);
    if (t < count) { probs[t] = exp(scores[t] - mNew); }
    workgroupBarrier();
    l *= correction;
    for (var a = 0u; a < NACC; a++) { acc[a] *= correction; }
    for (var i = 0u; i < count; i++) {
      let p = probs[i];
      l += p;
      let vb = slots[i] * ${kvDim}u + kvBase;
      for (var a = 0u; a < NACC; a++) {
        let d = t + a * TILE;
        if (d < HD) { acc[a] += p * Vc[vb + d]; }
      }
    }
    m = mNew;
    workgroupBarrier();
  }
  for (var a = 0u; a < NACC; a++) {
    let d = t + a * TILE;
    if (d < HD) { O[r * ${qDim}u + h * HD + d] = acc[a] / l; }
  }
}
`;
}

export interface AttentionTarget {
  readonly dims: GPUBufferBinding | GPUBuffer;
  readonly rows: GPUBufferBinding | GPUBuffer;
  readonly seqs: GPUBufferBinding | GPUBuffer;
  readonly tables: GPUBufferBinding | GPUBuffer;
  readonly q: GPUBuffer;
  readonly kCache: GPUBuffer;
  readonly vCache: GPUBuffer;
  readonly out: GPUBuffer;
}

/** A bound paged attention over `rows` rows. */
export function createAttention(gpu: Gpu, config: ModelConfig, blockSize: number, t: AttentionTarget) {
  const pipeline = gpu.pipeline(attentionWgsl(config, blockSize), "attention");
  const group = bindAll(gpu, pipeline, [t.dims, t.rows, t.seqs, t.tables, t.q, t.kCache, t.vCache, t.out], "attention");
  return {
    encode(pass: GPUComputePassEncoder, rows: number): void {
      if (rows === 0) return;
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(config.nHeads, rows);
    },
  };
}
