import type { ModelConfig } from "../../lib/model/model_config.ts";
import { bindAll, type Gpu, type KernelOp } from "./device.ts";
import { DIM_ROWS, WGSL_STEP_TYPES } from "./step_meta.ts";
import { type KvDtype, kvElementBytes, kvWgsl } from "./kv_dtype.ts";

/** Threads per workgroup: 32 when a KV group's outputs fit (fewer idle lanes), else 64. */
function threadsFor(group: number, headDim: number): number {
  return group * headDim <= 32 && group <= 32 ? 32 : 64;
}

/**
 * What every attention kernel opens with: the KV dtype's enable, the step types, and the
 * step's dims, rows, sequences and block tables at bindings 0 to 3.
 */
function wgslAttentionHead(kv: ReturnType<typeof kvWgsl>): string {
  return `${kv.enable}
${WGSL_STEP_TYPES}
@group(0) @binding(0) var<uniform> dims: vec4<u32>;
@group(0) @binding(1) var<storage, read> rows: array<Row>;
@group(0) @binding(2) var<storage, read> seqs: array<Seq>;
@group(0) @binding(3) var<storage, read> tables: array<u32>;`;
}

/**
 * WGSL for paged causal attention, one workgroup per (row, KV head) serving the G query heads
 * that share it (grouped-query attention reads each K/V row once for all G). The row at
 * position p attends to positions 0..p of its sequence, reading K/V through the sequence's
 * block table (a prefill chunk's own rows were stored by the preceding rope+store dispatch);
 * q comes from the rows of the fused q | k | v projection.
 *
 * Keys go in tiles of T/G (T = 32 or 64 threads) with an online softmax. Thread t scores
 * (head t / TK, key t % TK); then each output thread scans its head's scores in key order for
 * the max, exponentiates and accumulates. Every thread that needs a value computes it the same
 * way, so a row's output depends only on its own sequence, never on the rest of the batch.
 * Scores and slots are double-buffered by tile parity: one barrier per tile.
 */
export function attentionWgsl(
  config: ModelConfig,
  blockSize: number,
  kvDtype: KvDtype = "f32",
): string {
  const { nHeads, nKvHeads, headDim } = config;
  const kv = kvWgsl(kvDtype);
  const qDim = nHeads * headDim;
  const kvDim = nKvHeads * headDim;
  const stride = qDim + 2 * kvDim;
  const group = nHeads / nKvHeads;
  const threads = threadsFor(group, headDim);
  if (group > threads || threads % group !== 0) {
    throw new Error(
      `Cannot build attention: ${group} query heads per KV head must divide ${threads}`,
    );
  }
  const tk = threads / group;
  // Output element (head, dim) = t + 64a of the group's G x HD, one register set each.
  const outs = Array.from({ length: Math.ceil((group * headDim) / threads) }, (_, a) => a);
  const each = (f: (a: number) => string) => outs.map(f).join("\n    ");
  return /* wgsl */ `${wgslAttentionHead(kv)}
@group(0) @binding(4) var<storage, read> QKV: array<f32>;
@group(0) @binding(5) var<storage, read> Kc: ${kv.scalarArray};
@group(0) @binding(6) var<storage, read> Vc: ${kv.scalarArray};
@group(0) @binding(7) var<storage, read_write> O: array<f32>;
const HD = ${headDim}u;
const TK = ${tk}u;
const GHD = ${group * headDim}u;
const SCALE = ${1 / Math.sqrt(headDim)};
var<workgroup> qs: array<f32, ${group * headDim}>;
var<workgroup> scores: array<f32, ${2 * threads}>;
var<workgroup> slots: array<u32, ${2 * tk}>;

// Max of head g's scores over the first count keys of the tile in buffer b, in key order.
fn tileMax(b: u32, g: u32, count: u32) -> f32 {
  let at = b * ${threads}u + g * TK;
  var v = scores[at];
  for (var i = 1u; i < count; i++) { v = max(v, scores[at + i]); }
  return v;
}

@compute @workgroup_size(${threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let r = wid.y;
  let kvh = wid.x;
  if (r >= dims[${DIM_ROWS}]) { return; }
  let row = rows[r];
  let seq = seqs[row.seq];
  let kvBase = kvh * HD;
  // The group's query heads are contiguous: heads kvh*G .. kvh*G + G - 1.
  let qBase = r * ${stride}u + kvh * GHD;
  for (var i = t; i < GHD; i += ${threads}u) { qs[i] = QKV[qBase + i]; }
  workgroupBarrier();
  let n = row.pos + 1u;
  let pg = t / TK;
  let pk = t % TK;
  ${
    each((a) =>
      `let g${a} = min((t + ${a * threads}u) / HD, ${group - 1}u);
    var m${a} = 0.0;
    var l${a} = 0.0;
    var acc${a} = 0.0;`
    )
  }
  for (var t0 = 0u; t0 < n; t0 += TK) {
    let key = t0 + pk;
    let b = (t0 / TK) & 1u;
    if (key < n) {
      let slot = tables[seq.tableOffset + key / ${blockSize}u] * ${blockSize}u + key % ${blockSize}u;
      if (pg == 0u) { slots[b * TK + pk] = slot; }
      let kb = slot * ${kvDim}u + kvBase;
      var dot = 0.0;
      for (var d = 0u; d < HD; d++) { dot += qs[pg * HD + d] * ${kv.load("Kc", "kb + d")}; }
      scores[b * ${threads}u + t] = dot * SCALE;
    }
    workgroupBarrier();
    let count = min(TK, n - t0);
    let first = t0 == 0u;
    ${
    each((a) =>
      `if (t + ${a * threads}u < GHD) {
      let tm = tileMax(b, g${a}, count);
      let mNew = select(max(m${a}, tm), tm, first);
      let corr = select(exp(m${a} - mNew), 0.0, first);
      l${a} *= corr;
      acc${a} *= corr;
      let d = (t + ${a * threads}u) % HD;
      for (var i = 0u; i < count; i++) {
        let p = exp(scores[b * ${threads}u + g${a} * TK + i] - mNew);
        l${a} += p;
        acc${a} += p * ${kv.load("Vc", `slots[b * TK + i] * ${kvDim}u + kvBase + d`)};
      }
      m${a} = mNew;
    }`
    )
  }
  }
  ${
    each((a) =>
      `if (t + ${a * threads}u < GHD) { O[r * ${qDim}u + kvh * GHD + t + ${
        a * threads
      }u] = acc${a} / l${a}; }`
    )
  }
}
`;
}

/**
 * WGSL for the same attention shaped for CPU rasterizers: one thread per (row, KV head) serving
 * the G query heads that share it (each K/V vector loaded once for all G), with q, the running
 * max, sum and output in registers, walking the row's keys in order with an online softmax. No workgroup memory and no barrier; a row's result is one fixed chain of
 * operations, whatever else shares the step.
 */
export function attentionLaneWgsl(
  config: ModelConfig,
  blockSize: number,
  kvDtype: KvDtype = "f32",
): string {
  const { nKvHeads } = config;
  const kv = kvWgsl(kvDtype);
  const qDim = config.nHeads * config.headDim;
  const body = wgslLaneAttentionBody(config, blockSize, kvDtype, {
    q: "QKV",
    out: (i) => `O[(r * ${qDim}u) / 4u + ${i}]`,
  });
  return /* wgsl */ `${wgslAttentionHead(kv)}
@group(0) @binding(4) var<storage, read> QKV: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> Kc: ${kv.vec4Array};
@group(0) @binding(6) var<storage, read> Vc: ${kv.vec4Array};
@group(0) @binding(7) var<storage, read_write> O: array<vec4<f32>>;
@compute @workgroup_size(${LANE_ATTENTION_THREADS})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let nRows = dims[${DIM_ROWS}];
  let task = gid.x;
  if (task >= nRows * ${nKvHeads}u) { return; }
  let r = task / ${nKvHeads}u;
  let kvh = task % ${nKvHeads}u;
  ${body}
}
`;
}

/**
 * The lane attention of row r (a step row index) and KV head kvh, both in scope: reads q from
 * the vec4 array named `q` (rows of q | k | v), K/V from Kc/Vc through rows, seqs and tables,
 * and stores the group's output vec4s at `out(i)`, i a WGSL u32 expression counting the row's
 * output vec4s from its start (head kvh·G's first). Shared by the attention kernel and the
 * matmul that runs attention as its prologue.
 */
export function wgslLaneAttentionBody(
  config: Pick<ModelConfig, "nHeads" | "nKvHeads" | "headDim">,
  blockSize: number,
  kvDtype: KvDtype,
  io: { readonly q: string; readonly out: (i: string) => string },
): string {
  const { nHeads, nKvHeads, headDim } = config;
  const kv = kvWgsl(kvDtype);
  if (headDim % 4 !== 0) {
    throw new Error(`Cannot build lane attention: head size ${headDim} is not a multiple of 4`);
  }
  const kvDim = nKvHeads * headDim;
  const stride = nHeads * headDim + 2 * kvDim;
  const group = nHeads / nKvHeads;
  const nv = headDim / 4;
  const vs = Array.from({ length: nv }, (_, i) => i);
  const gs = Array.from({ length: group }, (_, g) => g);
  const each = (f: (i: number) => string, sep = "\n  ") => vs.map(f).join(sep);
  const heads = (f: (g: number) => string, sep = "\n  ") => gs.map(f).join(sep);
  return `let row = rows[r];
  let seq = seqs[row.seq];
  let kvBase = kvh * ${nv}u;
  // The group's query heads are contiguous: heads kvh*G .. kvh*G + G - 1.
  let qBase = (r * ${stride}u + kvh * ${group * headDim}u) / 4u;
  ${
    heads((g) =>
      each((i) => `let q${g}_${i} = ${io.q}[qBase + ${g * nv + i}u] * ${1 / Math.sqrt(headDim)};`)
    )
  }
  ${heads((g) => each((i) => `var acc${g}_${i} = vec4<f32>(0.0);`))}
  ${heads((g) => `var m${g} = -3.402823e38; var l${g} = 0.0;`)}
  let n = row.pos + 1u;
  for (var key = 0u; key < n; key++) {
    let slot = tables[seq.tableOffset + key / ${blockSize}u] * ${blockSize}u + key % ${blockSize}u;
    let kb = slot * ${kvDim / 4}u + kvBase;
    ${
    each(
      (i) =>
        `let k${i} = ${kv.loadVec4("Kc", `kb + ${i}u`)}; let v${i} = ${
          kv.loadVec4("Vc", `kb + ${i}u`)
        };`,
      "\n    ",
    )
  }
    ${
    heads((g) =>
      `{
      let s = ${each((i) => `dot(q${g}_${i}, k${i})`, " + ")};
      let mNew = max(m${g}, s);
      let corr = exp(m${g} - mNew);
      let p = exp(s - mNew);
      l${g} = l${g} * corr + p;
      ${each((i) => `acc${g}_${i} = acc${g}_${i} * corr + p * v${i};`, "\n      ")}
      m${g} = mNew;
    }`, "\n    ")
  }
  }
  ${
    heads((g) =>
      each((i) => `${io.out(`kvh * ${group * nv}u + ${g * nv + i}u`)} = acc${g}_${i} / l${g};`)
    )
  }`;
}

/** Threads per workgroup of the lane layout (one SIMD batch of a CPU rasterizer's). */
const LANE_ATTENTION_THREADS = 8;

/** How attention spreads its work (see {@link createAttention}). */
export type AttentionLayout = "tiled" | "lane";

export interface AttentionTarget {
  readonly dims: GPUBufferBinding | GPUBuffer;
  readonly rows: GPUBufferBinding | GPUBuffer;
  readonly seqs: GPUBufferBinding | GPUBuffer;
  readonly tables: GPUBufferBinding | GPUBuffer;
  /** Rows of q | k | v; only q is read. */
  readonly qkv: GPUBuffer;
  readonly kCache: GPUBuffer;
  readonly vCache: GPUBuffer;
  readonly out: GPUBuffer;
  /** How the pools hold elements (default f32). */
  readonly kvDtype?: KvDtype;
  /**
   * "tiled" (a workgroup per row and KV head, key tiles in workgroup memory; suits GPUs) or
   * "lane" (a thread per row and query head; suits CPU rasterizers). Default by device.
   */
  readonly layout?: AttentionLayout;
}

/** A bound paged attention over `rows` rows. */
export function createAttention(
  gpu: Gpu,
  config: ModelConfig,
  blockSize: number,
  t: AttentionTarget,
): KernelOp {
  const lane = (t.layout ?? (gpu.cpuRasterizer && config.headDim % 4 === 0 ? "lane" : "tiled")) ===
    "lane";
  const pipeline = gpu.pipeline(
    lane
      ? attentionLaneWgsl(config, blockSize, t.kvDtype)
      : attentionWgsl(config, blockSize, t.kvDtype),
    "attention",
  );
  const group = bindAll(gpu, pipeline, [
    t.dims,
    t.rows,
    t.seqs,
    t.tables,
    t.qkv,
    t.kCache,
    t.vCache,
    t.out,
  ], "attention");
  return {
    label: "attention",
    cost(c) {
      const { nHeads, nKvHeads, headDim } = config;
      const keys = c.rows.reduce((s, r) => s + r.pos + 1, 0);
      return {
        flops: 4 * nHeads * headDim * keys,
        bytes: 2 * nKvHeads * headDim * kvElementBytes(t.kvDtype ?? "f32") * keys +
          2 * c.rows.length * nHeads * headDim * 4,
      };
    },
    encode(pass: GPUComputePassEncoder, rows: number): void {
      if (rows === 0) return;
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      if (lane) {
        pass.dispatchWorkgroups(Math.ceil((rows * config.nKvHeads) / LANE_ATTENTION_THREADS));
      } else pass.dispatchWorkgroups(config.nKvHeads, rows);
    },
  };
}
