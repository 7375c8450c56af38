import { type ModelConfig, ropeFrequencies } from "../../lib/model/model_config.ts";
import { bindAll, type Gpu, type KernelOp, uploadBuffer } from "./device.ts";
import { DIM_ROWS, WGSL_STEP_TYPES } from "./step_meta.ts";
import { type KvDtype, kvElementBytes, kvWgsl } from "./kv_dtype.ts";

/**
 * cos/sin of pos * freq_i (ropeFrequencies(): theta^(-2i/ropeDim), divided by any Llama 3
 * factor) for every position and pair, computed in double precision once (as the CPU
 * reference does) rather than with the GPU's sin/cos, whose error grows with the angle.
 */
export function ropeTable(config: ModelConfig, positions: number): Float32Array {
  const pairs = config.ropeDim / 2;
  const freqs = ropeFrequencies(config);
  const table = new Float32Array(positions * pairs * 2);
  for (let i = 0; i < pairs; i++) {
    const freq = freqs[i]!;
    for (let pos = 0; pos < positions; pos++) {
      const angle = pos * freq;
      table[(pos * pairs + i) * 2] = Math.cos(angle);
      table[(pos * pairs + i) * 2 + 1] = Math.sin(angle);
    }
  }
  return table;
}

/**
 * WGSL that rotates each row's q in place and its k into the KV pool, llama2.c style (adjacent
 * pairs within each head), and copies v into the pool, at the slot the row's block table names.
 * A row of `qkv` holds q, then k, then v (the fused projection's output).
 */
export function ropeStoreWgsl(config: ModelConfig, kvDtype: KvDtype = "f32"): string {
  const { nHeads, nKvHeads, headDim, ropeDim } = config;
  const kv = kvWgsl(kvDtype);
  const qDim = nHeads * headDim;
  const kvDim = nKvHeads * headDim;
  const stride = qDim + 2 * kvDim;
  return /* wgsl */ `${kv.enable}
${WGSL_STEP_TYPES}
@group(0) @binding(0) var<uniform> dims: vec4<u32>;
@group(0) @binding(1) var<storage, read> rows: array<Row>;
@group(0) @binding(2) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> QKV: array<f32>;
@group(0) @binding(4) var<storage, read_write> Kc: ${kv.scalarArray};
@group(0) @binding(5) var<storage, read_write> Vc: ${kv.scalarArray};
const HALF = ${headDim / 2}u;
const PAIRS = ${ropeDim / 2}u;
fn rotate(v: vec2<f32>, cs: vec2<f32>) -> vec2<f32> {
  return vec2<f32>(v.x * cs.x - v.y * cs.y, v.x * cs.y + v.y * cs.x);
}
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let r = wg.x;
  if (r >= dims[${DIM_ROWS}]) { return; }
  let row = rows[r];
  let tb = row.pos * PAIRS;
  let base = r * ${stride}u;
  for (var i = t; i < ${qDim / 2}u; i += 64u) {
    let p = i % HALF;
    if (p < PAIRS) {
      let at = base + 2u * i;
      let v = rotate(vec2<f32>(QKV[at], QKV[at + 1u]), table[tb + p]);
      QKV[at] = v.x;
      QKV[at + 1u] = v.y;
    }
  }
  for (var i = t; i < ${kvDim / 2}u; i += 64u) {
    let p = i % HALF;
    let at = base + ${qDim}u + 2u * i;
    var v = vec2<f32>(QKV[at], QKV[at + 1u]);
    if (p < PAIRS) { v = rotate(v, table[tb + p]); }
    ${kv.storePair("Kc", `row.slot * ${kvDim}u + 2u * i`, "v")}
  }
  for (var j = t; j < ${kvDim / 2}u; j += 64u) {
    let at = base + ${qDim + kvDim}u + 2u * j;
    ${kv.storePair("Vc", `row.slot * ${kvDim}u + 2u * j`, "vec2<f32>(QKV[at], QKV[at + 1u])")}
  }
}
`;
}

export interface RopeStoreTarget {
  readonly dims: GPUBufferBinding | GPUBuffer;
  readonly rows: GPUBufferBinding | GPUBuffer;
  /** ropeTable() uploaded once per model. */
  readonly table: GPUBuffer;
  /** Rows of q | k | v. */
  readonly qkv: GPUBuffer;
  readonly kCache: GPUBuffer;
  readonly vCache: GPUBuffer;
  /** How the pools hold elements (default f32). */
  readonly kvDtype?: KvDtype;
}

/** Uploads ropeTable() for positions 0..positions-1. */
export function uploadRopeTable(gpu: Gpu, config: ModelConfig, positions: number): GPUBuffer {
  return uploadBuffer(gpu, ropeTable(config, positions), GPUBufferUsage.STORAGE, "rope table");
}

/** A bound RoPE + KV-store over `rows` rows. */
export function createRopeStore(gpu: Gpu, config: ModelConfig, t: RopeStoreTarget): KernelOp {
  const pipeline = gpu.pipeline(ropeStoreWgsl(config, t.kvDtype), "rope+store");
  const group = bindAll(
    gpu,
    pipeline,
    [t.dims, t.rows, t.table, t.qkv, t.kCache, t.vCache],
    "rope+store",
  );
  return {
    label: "rope+kv store",
    cost(c) {
      const { nHeads, nKvHeads, headDim } = config;
      const qkv = (nHeads + 2 * nKvHeads) * headDim;
      return {
        flops: c.rows.length * (nHeads + nKvHeads) * headDim * 3,
        bytes: c.rows.length * (qkv + nHeads * headDim) * 4 +
          c.rows.length * 2 * nKvHeads * headDim * kvElementBytes(t.kvDtype ?? "f32"),
      };
    },
    encode(pass: GPUComputePassEncoder, rows: number): void {
      if (rows === 0) return;
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(rows);
    },
  };
}
