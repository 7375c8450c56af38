import type { TensorType } from "../../lib/model/tensor.ts";
import { type Gpu, type KernelOp, uploadBuffer } from "./device.ts";
import type { GpuMatrix } from "./gpu_matrix.ts";
import { DIM_SAMPLES, WGSL_STEP_TYPES } from "./step_meta.ts";
import {
  chunkElements,
  chunkOffset,
  chunkVec4s,
  needsVec4View,
  wgslLoadChunk,
  wgslWeights,
} from "./weight_formats.ts";
import { type KvDtype, kvElementBytes, kvWgsl } from "./kv_dtype.ts";
import type { ModelConfig } from "../../lib/model/model_config.ts";
import { wgslLaneAttentionBody } from "./attention.ts";
import { LANE_THREADS } from "./adapter.ts";
import { q6kHalfLoop } from "./q6k_half_loop.ts";

/** Activation rows one workgroup multiplies against each weight chunk it loads. */
export const MATMUL_ROWS_PER_GROUP = 8;
const THREADS = 64;
const CHUNKS_PER_THREAD = 4;

/**
 * How a matmul's 64 threads split the work: TO output features x KS slices along the row, with
 * at least CHUNKS_PER_THREAD chunks per thread so each workgroup does enough work to pay for
 * its barrier (costly on CPU rasterizers; on GPUs wide rows still get KS = 64).
 */
export function matmulSplit(
  type: TensorType,
  cols: number,
  epilogue: MatmulEpilogue = "store",
): { ks: number; to: number } {
  const chunks = cols / chunkElements(type);
  // The rope epilogue finishes output pairs in one workgroup: at least two outputs each.
  const most = epilogue === "rope" ? THREADS / 2 : THREADS;
  let ks = 1;
  while (ks * 2 <= most && ks * 2 * CHUNKS_PER_THREAD <= chunks) ks *= 2;
  return { ks, to: THREADS / ks };
}

/**
 * What happens to Σ_k W[o,k]·x[k]: stored, added to y (the residual add), or, for a matrix
 * whose rows interleave gate and up (gate_j = row 2j, up_j = row 2j+1), silu(gate)·up stored.
 */
export type MatmulEpilogue = "store" | "accumulate" | "swiglu" | "rope";

/**
 * Head layout of a q | k | v projection whose "rope" epilogue (either layout) rotates q and
 * k llama2.c style (adjacent pairs within each head, by rows[r].pos) and writes q to y, and k
 * and v into the KV pools at rows[r].slot: the projection and the RoPE + KV store in one pass.
 */
export interface RopeShape {
  readonly qDim: number;
  readonly kvDim: number;
  readonly headDim: number;
  readonly ropeDim: number;
  /** How the KV pools hold elements (default f32). */
  readonly kvDtype?: KvDtype;
  /** Add a bias over q | k | v features (binding 13) before rotating: Qwen2's q/k/v biases. */
  readonly bias?: boolean;
}

/** How a matmul spreads its work over threads (see {@link MatmulTarget.layout}). */
export type MatmulLayout = "split" | "lane";

/** Compile-time shape of a matmul kernel. */
export interface MatmulSpec {
  readonly type: TensorType;
  readonly cols: number;
  /** The matrix's row group (GpuMatrix.group); default 1, row-major. */
  readonly group?: number;
  /** Index into dims of the row count. */
  readonly rowsField: number;
  readonly epilogue: MatmulEpilogue;
  /** Fused RMSNorm of the input rows (norm weights bound at binding 5). */
  readonly normEps?: number;
  /** Row i of the input is samples[i].row (binding 6): the final norm + logits. */
  readonly gather?: boolean;
  /** With the "rope" epilogue. */
  readonly rope?: RopeShape;
  /** The input rows are the paged attention of rows of q | k | v (lane layout only). */
  readonly attention?: AttentionShape;
  /**
   * After adding into y, also write the model's final RMSNorm of each sampled row's new y to
   * its compact row in Xn (binding 15; norm weights at 5, samples at 6): the classifier's norm
   * dispatch folded into the last layer's down projection. Lane layout, one workgroup spanning
   * all outputs, and the "accumulate" epilogue only.
   */
  readonly finalNorm?: { readonly eps: number };
  /**
   * Lane layout where the workgroup is one subgroup (Gpu.laneSubgroups): each lane loads one
   * vec4 of a chunk's activations (and norm weights) and the lanes share them by
   * subgroupBroadcast; the same values in the same order, so the same bits. Needs chunks of a
   * multiple of 8 vec4s (block types) and input rows from X (not attention's tile).
   */
  readonly broadcast?: boolean;
}

/**
 * Attention as a matmul's prologue: each workgroup attends for its own row tile into workgroup
 * memory, then multiplies those rows (the output projection), so attention costs no dispatch of
 * its own. Every workgroup of the tile's rows repeats the attention: the layer uses it only when
 * one workgroup spans all outputs.
 */
export interface AttentionShape {
  readonly config: Pick<ModelConfig, "nHeads" | "nKvHeads" | "headDim">;
  readonly blockSize: number;
  readonly kvDtype: KvDtype;
}

/**
 * WGSL for y[r, yOffset + o] = epilogue(Σ_k W[o, k] · x'[r, k]) for r < dims[rowsField], where
 * x' is x, or RMSNorm(x) when normEps is set: the norm is fused as scale_r · Σ W[o,k]·(w[k]·x[k]),
 * with Σx² gathered by the same threads in the same pass.
 *
 * KS threads reduce each output: each sums a fixed strided set of chunks (a vec4, or one quant
 * block dequantized in registers), then one thread adds the KS partials in order. So a row's
 * result never depends on which rows share its workgroup (batch invariance). Rows are unrolled
 * so no private array is indexed dynamically (slow on CPU rasterizers such as llvmpipe).
 */
export function matmulWgsl(spec: MatmulSpec): string {
  const { type, cols, rowsField, epilogue } = spec;
  const { ks, to } = matmulSplit(type, cols, epilogue);
  const tr = MATMUL_ROWS_PER_GROUP;
  const rope = spec.rope;
  if (epilogue === "rope" && !rope) {
    throw new Error("Cannot build the rope epilogue without the head layout");
  }
  const kv = kvWgsl(rope?.kvDtype ?? "f32");
  const norm = spec.normEps !== undefined;
  const dual = epilogue === "swiglu";
  const nv = chunkVec4s(type);
  const rows = Array.from({ length: tr }, (_, r) => r);
  const accs = dual ? ["g", "u"] : ["a"];
  const partials = [...accs, ...(norm ? ["s"] : [])];

  const loads = dual
    ? `${wgslLoadChunk(type, cols, "2u * o", "wg", spec.group)}\n      ${
      wgslLoadChunk(type, cols, "2u * o + 1u", "wu", spec.group)
    }`
    : wgslLoadChunk(type, cols, "o", "wa", spec.group);
  const { normLoads, dotWith, rowInputs } = wgslChunkInputs(nv, norm, "load");
  const perRow = rows.map((r) => {
    const { xs, xw, sumSq } = rowInputs(r);
    const accum = accs.map((a) => `${a}${r} += w${a}d * (${dotWith(`w${a}`)});`).join(" ");
    return `if (${r}u < live) { ${xs} ${xw} ${accum} ${sumSq} }`;
  }).join("\n      ");
  const sharedDecls = partials.map((p) => `var<workgroup> part_${p}: array<f32, ${THREADS * tr}>;`)
    .join("\n");
  const zeroDecls = rows.map((r) => partials.map((p) => `var ${p}${r} = 0.0;`).join(" ")).join(
    "\n  ",
  );
  const stores = rows.map((r) =>
    `if (${r}u < live) { ${
      partials.map((p) => `part_${p}[${r * THREADS}u + t] = ${p}${r};`).join(" ")
    } }`
  ).join("\n  ");
  const sum = (p: string) =>
    `var ${p}t = 0.0; for (var i = 0u; i < KS; i++) { ${p}t += part_${p}[r * ${THREADS}u + g + i]; }`;
  const scale = norm
    ? `let scale = 1.0 / sqrt(st / ${cols}.0 + ${spec.normEps!.toExponential()});`
    : "let scale = 1.0;";
  const result = dual
    ? "let gs = gt * scale; let v = gs / (1.0 + exp(-gs)) * (ut * scale);"
    : "let v = at * scale;";
  const write = epilogue === "accumulate" ? "Y[yi] = Y[yi] + v;" : "Y[yi] = v;";
  // Rope: the thread of each even output also sums its odd partner's partials (the next KS).
  const finish = epilogue === "rope"
    ? `if ((o & 1u) == 0u) {
      ${partials.map(sum).join("\n      ")}
      var at1 = 0.0; for (var i = 0u; i < KS; i++) { at1 += part_a[r * ${THREADS}u + g + KS + i]; }
      ${scale}
      let row = rows[r0 + r];
      ${
      wgslRopePair(rope!, kv, {
        x: "at * scale",
        y: "at1 * scale",
        row: "row",
        o: "o",
        yRow: "(r0 + r)",
      })
    }
    }`
    : `if (o < chunk.rows) {
      ${partials.map(sum).join("\n      ")}
      ${scale}
      ${result}
      let yi = (r0 + r) * chunk.yStride + chunk.yOffset + o;
      ${write}
    }`;
  const srcRows = rows.map((r) =>
    `let src${r} = ${spec.gather ? `samples[min(r0 + ${r}u, nRows - 1u)].row` : `r0 + ${r}u`};`
  )
    .join(" ");

  return /* wgsl */ `${matmulHead(type, norm, spec.gather === true, rope, kv)}
const KS = ${ks}u;
const TO = ${to}u;
${sharedDecls}
${
    wgslRowTileMain({
      type,
      cols,
      threads: THREADS,
      broadcast: false,
      rows: `dims[${rowsField}]`,
      tile: tr,
    })
  }
  let o = (wid.y + wid.z * nwg.y) * TO + t / KS;
  let s = t % KS;
  ${srcRows}
  ${zeroDecls}
  if (o < chunk.rows) {
    for (var c = s; c < NCHUNK; c += KS) {
      ${loads}
      ${normLoads}
      ${perRow}
    }
  }
  ${stores}
  workgroupBarrier();
  // Thread s of an output's group finishes rows s, s + KS, ...: KS partials added in order.
  let g = t - s;
  for (var r = s; r < live; r += KS) {
    ${finish}
  }
}
`;
}

/**
 * Shape of the lane layout's workgroup: `threads` lanes (one SIMD batch of a CPU rasterizer),
 * each owning `outs` output features (strided by `threads`) for `rows` token rows. One
 * activation load then feeds `outs` dot products and one weight chunk `rows` of them. Eight
 * outputs a lane, but four for a block type's gate|up pair (`dual`: eight weight rows already):
 * on the Qwen2.5-0.5B shape with subgroups, 8 against 4 took the Q8_0 classifier 28 -> 20 ms,
 * Q4_K down 10.3 -> 9.0 ms and Q6_K down (half-block loop) 11.1 -> 10.3 ms, while gate|up at 8
 * (16 rows a lane) went 34.6 -> 36.6 ms.
 */
export function laneShape(
  type: TensorType,
  dual = false,
): { threads: number; outs: number; rows: number } {
  const fewer = chunkVec4s(type) > 1 && dual;
  return { threads: LANE_THREADS, outs: fewer ? 4 : 8, rows: LANE_TILES.at(-1)! };
}

/**
 * Row tiles the lane layout compiles; a dispatch takes the smallest that covers its rows. A
 * decode step of one sequence then runs a one-row kernel: llvmpipe executes the unrolled rows
 * of an 8-row tile past the live ones (masked, not skipped), so one row paid for eight
 * (Qwen2.5-0.5B-shaped gate_up at 1 row: 214 -> 153 ms; at 4 rows with a 4-row tile: 240 ->
 * 194 ms). Each (row, output) sum is the same chain in every tile, so batch invariance holds.
 */
export const LANE_TILES = [1, 2, 4, 8] as const;

/** The tile a lane matmul over `rows` token rows runs with. */
export function laneTile(rows: number): number {
  return LANE_TILES.find((t) => t >= rows) ?? LANE_TILES.at(-1)!;
}

/**
 * WGSL for the same product as {@link matmulWgsl}, shaped for CPU rasterizers (llvmpipe): each
 * thread owns a few output features and a tile of token rows ({@link laneShape}), and walks the
 * row's chunks in order, so each (row, output) sum is one sequential chain (batch invariant)
 * with no workgroup memory and no barrier. llvmpipe loads storage buffers lane by lane, so the
 * shape is chosen to reuse every load: an activation vec4 feeds all the thread's outputs, a
 * weight chunk all the tile's rows.
 */
export function matmulLaneWgsl(spec: MatmulSpec, tile = laneShape(spec.type).rows): string {
  const { type, cols, rowsField, epilogue } = spec;
  const dual = epilogue === "swiglu";
  const { threads, outs } = laneShape(type, dual);
  const tr = tile;
  const norm = spec.normEps !== undefined;
  const nv = chunkVec4s(type);
  const rows = Array.from({ length: tr }, (_, r) => r);
  const js = Array.from({ length: outs }, (_, j) => j);
  const accs = dual ? ["g", "u"] : ["a"];
  // Q4_0/Q5_0 quants are loaded without their offset, subtracted once per product through the
  // chunk's activation sum (chunkOffset).
  const offset = chunkOffset(type);
  const uncentered = offset > 0;
  const loads = js.map((j) =>
    dual
      ? `${wgslLoadChunk(type, cols, `2u * oc${j}`, `w${j}g`, spec.group, uncentered)}\n      ${
        wgslLoadChunk(type, cols, `2u * oc${j} + 1u`, `w${j}u`, spec.group, uncentered)
      }`
      : wgslLoadChunk(type, cols, `oc${j}`, `w${j}a`, spec.group, uncentered)
  ).join("\n      ");
  const att = spec.attention;
  const broadcast = spec.broadcast === true;
  if (broadcast && (att || !broadcastFits(type))) {
    throw new Error(
      `Cannot build a lane matmul that broadcasts activations for ${type} (${nv} vec4s a chunk)${
        att ? " with attention as its prologue" : ""
      }: it needs chunks of a multiple of ${threads} vec4s read from X`,
    );
  }
  const { normLoads, dotWith, rowInputs } = wgslChunkInputs(
    nv,
    norm,
    att ? "tile" : broadcast ? "broadcast" : "load",
    offset,
  );
  // Q6_K without a norm or a gate|up pair (the down projections) walks half super-blocks, as
  // the classifier does: each ql/qh word loaded once instead of once per 32-element chunk.
  const halfLoop = type === "q6_k" && !norm && !dual && !att && epilogue !== "rope";
  const perRow = rows.map((r) => {
    const { xs, xw, sx, sumSq } = rowInputs(r);
    const accum = js.map((j) =>
      accs.map((a) => `${a}${j}_${r} += w${j}${a}d * (${dotWith(`w${j}${a}`)});`).join(" ")
    ).join(" ");
    const body = `{ ${xs} ${xw} ${sx} ${accum} ${sumSq} }`;
    return tr === 1 ? body : `if (${r}u < live) ${body}`;
  }).join("\n      ");
  const zeroDecls = rows.map((r) =>
    [
      ...js.flatMap((j) => accs.map((a) => `var ${a}${j}_${r} = 0.0;`)),
      ...(norm ? [`var s${r} = 0.0;`] : []),
    ].join(" ")
  ).join("\n  ");
  const rope = spec.rope;
  if (epilogue === "rope" && (!rope || outs % 2 !== 0)) {
    throw new Error("Cannot build the rope epilogue without the head layout, or with odd outputs");
  }
  if (rope && att) throw new Error("Cannot build a matmul with both rope and attention");
  const fin = spec.finalNorm;
  if (fin && (epilogue !== "accumulate" || norm || spec.gather)) {
    throw new Error(
      `Cannot build the final norm into a matmul but after an accumulating epilogue without a norm or gathered rows of its own (epilogue ${epilogue})`,
    );
  }
  const kv = kvWgsl(rope?.kvDtype ?? att?.kvDtype ?? "f32");
  const ropePair = (r: number, j: number) =>
    wgslRopePair(rope!, kv, {
      x: `a${j}_${r} * scale`,
      y: `a${j + 1}_${r} * scale`,
      row: `row${r}`,
      o: `o${j}`,
      yRow: `(r0 + ${r}u)`,
    });
  const stores = rows.map((r) => {
    const scale = norm
      ? `let scale = 1.0 / sqrt(s${r} / ${cols}.0 + ${spec.normEps!.toExponential()});`
      : "let scale = 1.0;";
    if (epilogue === "rope") {
      const pairs = js.filter((j) => j % 2 === 0).map((j) => ropePair(r, j)).join("\n    ");
      return `if (${r}u < live) { ${scale} let row${r} = rows[r0 + ${r}u];\n    ${pairs} }`;
    }
    const outsW = js.map((j) => {
      const result = dual
        ? `let gs = g${j}_${r} * scale; let v = gs / (1.0 + exp(-gs)) * (u${j}_${r} * scale);`
        : `let v = a${j}_${r} * scale;`;
      const write = fin
        ? `let ny = Y[yi] + v; Y[yi] = ny; fy${j}_${r} = ny;`
        : epilogue === "accumulate"
        ? "Y[yi] = Y[yi] + v;"
        : "Y[yi] = v;";
      return `if (o${j} < chunk.rows) { ${result} let yi = (r0 + ${r}u) * chunk.yStride + chunk.yOffset + o${j}; ${write} }`;
    }).join(" ");
    return `if (${r}u < live) { ${scale} ${outsW} }`;
  }).join("\n  ");
  const srcRows = rows.map((r) =>
    `let src${r} = ${
      spec.gather ? `samples[min(r0 + ${r}u, nRows - 1u)].row` : `min(r0 + ${r}u, nRows - 1u)`
    };`
  ).join(" ");
  // Thread t owns adjacent pairs (base + 2*threads*jj + 2t, + 1): whole RoPE pairs.
  const outIdx = js.map((j) =>
    `let o${j} = base + ${
      (j >> 1) * 2 * threads + (j & 1)
    }u + 2u * t; let oc${j} = min(o${j}, chunk.rows - 1u);`
  ).join("\n  ");
  return /* wgsl */ `${matmulHead(type, norm, spec.gather === true, rope, kv)}
${
    fin
      ? `@group(0) @binding(5) var<storage, read> FNW: array<f32>;
@group(0) @binding(6) var<storage, read> samples: array<Sample>;
@group(0) @binding(15) var<storage, read_write> Xn: array<f32>;
var<workgroup> fpart: array<f32, ${tr * threads}>;`
      : ""
  }
${
    att
      ? `@group(0) @binding(7) var<storage, read> rows: array<Row>;
@group(0) @binding(9) var<storage, read> Kc: ${kv.vec4Array};
@group(0) @binding(10) var<storage, read> Vc: ${kv.vec4Array};
@group(0) @binding(11) var<storage, read> seqs: array<Seq>;
@group(0) @binding(12) var<storage, read> tables: array<u32>;
var<workgroup> A: array<vec4<f32>, ${(tr * cols) / 4}>;`
      : ""
  }
${wgslRowTileMain({ type, cols, threads, broadcast, rows: `dims[${rowsField}]`, tile: tr })}
  let base = (wid.y + wid.z * nwg.y) * ${threads * outs}u;
  ${att ? attentionPrologue(att, threads) : ""}
  // Lanes past the last output compute a copy of it and store nothing: no divergent branch.
  ${outIdx}
  ${srcRows}
  ${zeroDecls}
  ${fin ? rows.map((r) => js.map((j) => `var fy${j}_${r} = 0.0;`).join(" ")).join("\n  ") : ""}
  ${
    halfLoop
      ? q6kHalfLoop(cols, tr, outs, spec.group ?? 1, broadcast, (r, v) => `X[src${r} * XV + ${v}]`)
      : `for (var c = 0u; c < NCHUNK; c++) {
      ${loads}
      ${normLoads}
      ${perRow}
  }`
  }
  ${stores}
  ${fin ? finalNormEpilogue(fin.eps, tr, threads, outs) : ""}
}
`;
}

/**
 * A matmul kernel's module head: the KV dtype's enable, the step types, the chunk bindings, and
 * the optional inputs of its fused prologues (the RMSNorm weights, gathered sample rows, RoPE).
 */
function matmulHead(
  type: TensorType,
  norm: boolean,
  gather: boolean,
  rope: RopeShape | undefined,
  kv: ReturnType<typeof kvWgsl>,
): string {
  return `${kv.enable}
${WGSL_STEP_TYPES}
${wgslChunkBindings(type, 16, "X")}
${norm ? "@group(0) @binding(5) var<storage, read> NW: array<vec4<f32>>;" : ""}
${gather ? "@group(0) @binding(6) var<storage, read> samples: array<Sample>;" : ""}
${rope ? wgslRopeBindings(rope, kv) : ""}`;
}

/**
 * The bindings every chunked matrix kernel opens with: the step's dims, the chunk (its rows and
 * where in Y they go), the weights (wgslWeights: binding 2, and their vec4 view at
 * `vec4Binding` where the type needs one), the input rows `x` (binding 3) and Y (binding 4).
 */
export function wgslChunkBindings(type: TensorType, vec4Binding: number, x: string): string {
  return `struct Chunk { rows: u32, yStride: u32, yOffset: u32, unused: u32 }
@group(0) @binding(0) var<uniform> dims: vec4<u32>;
@group(0) @binding(1) var<uniform> chunk: Chunk;
${wgslWeights(type, vec4Binding)}
@group(0) @binding(3) var<storage, read> ${x}: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> Y: array<f32>;`;
}

/**
 * The opening of a row-tiled matrix kernel over `cols` columns of `type`: its constants
 * (NCHUNK weight chunks and XV input vec4s a row), the entry point (with the subgroup lane
 * where `broadcast`), and the tile of `tile` rows this workgroup takes: r0, and `live` rows of
 * it under `rows`. Row tiles vary fastest (wid.x), so the workgroups that share a weight tile
 * run together (cache reuse); a workgroup past the last row returns.
 */
export function wgslRowTileMain(o: {
  readonly type: TensorType;
  readonly cols: number;
  readonly threads: number;
  readonly broadcast: boolean;
  /** The WGSL expression of the row count. */
  readonly rows: string;
  readonly tile: number;
}): string {
  return `const NCHUNK = ${o.cols / chunkElements(o.type)}u;
const XV = ${o.cols / 4}u;
@compute @workgroup_size(${o.threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32${
    o.broadcast ? ", @builtin(subgroup_invocation_id) sl: u32" : ""
  }) {
  let nRows = ${o.rows};
  let r0 = wid.x * ${o.tile}u;
  if (r0 >= nRows) { return; }
  let live = min(${o.tile}u, nRows - r0);`;
}

/**
 * The final norm of the tile's sampled rows into Xn, from the new y values fy each lane just
 * stored: the lanes' sums of squares in lane order (every lane the same total), then each
 * lane writes its outputs of every compact row whose sample reads this token row.
 */
function finalNormEpilogue(eps: number, tile: number, threads: number, outs: number): string {
  const rows = Array.from({ length: tile }, (_, r) => r);
  const js = Array.from({ length: outs }, (_, j) => j);
  const parts = rows.map((r) =>
    `fpart[${r * threads}u + t] = ${js.map((j) => `fy${j}_${r} * fy${j}_${r}`).join(" + ")};`
  ).join("\n  ");
  const writes = rows.map((r) =>
    `if (${r}u < live) {
    var ss = 0.0;
    for (var l = 0u; l < ${threads}u; l++) { ss += fpart[${r * threads}u + l]; }
    let fscale = 1.0 / sqrt(ss / f32(chunk.rows) + ${eps.toExponential()});
    for (var i = 0u; i < dims[${DIM_SAMPLES}]; i++) {
      if (samples[i].row == r0 + ${r}u) {
        ${
      js.map((j) =>
        `if (o${j} < chunk.rows) { Xn[i * chunk.rows + o${j}] = fy${j}_${r} * FNW[o${j}] * fscale; }`
      ).join("\n        ")
    }
      }
    }
  }`
  ).join("\n  ");
  return `${parts}
  workgroupBarrier();
  ${writes}`;
}

/** The tile's rows attended into A (row lr of the tile at A[lr * XV]), every lane sharing them. */
function attentionPrologue(att: AttentionShape, threads: number): string {
  const { nKvHeads, nHeads } = att.config;
  if (nHeads % nKvHeads !== 0) {
    throw new Error(
      `Cannot build attention: ${nHeads} query heads are not a multiple of ${nKvHeads} KV heads`,
    );
  }
  const body = wgslLaneAttentionBody(att.config, att.blockSize, att.kvDtype, {
    q: "X",
    out: (i) => `A[lr * XV + ${i}]`,
  });
  return `for (var task = t; task < live * ${nKvHeads}u; task += ${threads}u) {
    let lr = task / ${nKvHeads}u;
    let kvh = task % ${nKvHeads}u;
    let r = r0 + lr;
    ${body}
  }
  workgroupBarrier();`;
}

/**
 * The "rope" epilogue for output features o, o + 1 of q | k | v (o even) with values x, y of
 * token row `row` (a Row) at step row `yRow`: the bias added, q rotated into Y, k rotated and v
 * copied into the KV pools at the row's slot. Both layouts use it.
 */
function wgslRopePair(
  rope: RopeShape,
  kv: ReturnType<typeof kvWgsl>,
  at: { x: string; y: string; row: string; o: string; yRow: string },
): string {
  const rot = "v = vec2<f32>(v.x * cs.x - v.y * cs.y, v.x * cs.y + v.y * cs.x);";
  const maybeRotate = (i: string) =>
    `let p = (${i} % ${rope.headDim}u) / 2u; if (p < ${
      rope.ropeDim / 2
    }u) { let cs = table[${at.row}.pos * ${rope.ropeDim / 2}u + p]; ${rot} }`;
  return `if (${at.o} < chunk.rows) {
      let f = chunk.yOffset + ${at.o};
      var v = vec2<f32>(${at.x}, ${at.y})${rope.bias ? " + vec2<f32>(QB[f], QB[f + 1u])" : ""};
      if (f < ${rope.qDim}u) {
        ${maybeRotate("f")}
        let yi = ${at.yRow} * chunk.yStride + f; Y[yi] = v.x; Y[yi + 1u] = v.y;
      } else if (f < ${rope.qDim + rope.kvDim}u) {
        let i = f - ${rope.qDim}u;
        ${maybeRotate("i")}
        ${kv.storePair("Kc", `${at.row}.slot * ${rope.kvDim}u + i`, "v")}
      } else {
        ${
    kv.storePair("Vc", `${at.row}.slot * ${rope.kvDim}u + f - ${rope.qDim + rope.kvDim}u`, "v")
  }
      }
    }`;
}

/** WGSL bindings of the "rope" epilogue (7, 8, 9, 10 and the bias at 13). */
function wgslRopeBindings(rope: RopeShape, kv: ReturnType<typeof kvWgsl>): string {
  return `@group(0) @binding(7) var<storage, read> rows: array<Row>;
@group(0) @binding(8) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(9) var<storage, read_write> Kc: ${kv.scalarArray};
@group(0) @binding(10) var<storage, read_write> Vc: ${kv.scalarArray};${
    rope.bias ? "\n@group(0) @binding(13) var<storage, read> QB: array<f32>;" : ""
  }`;
}

/** Where a matmul reads and writes. */
export interface MatmulTarget {
  /** The step's dims uniform (or any buffer holding the row count at rowsField). */
  readonly dims: GPUBuffer | GPUBufferBinding;
  readonly x: GPUBuffer;
  readonly y: GPUBuffer;
  readonly rowsField: number;
  readonly epilogue?: MatmulEpilogue;
  /** Fuse an RMSNorm of x with these f32 weights [cols]. */
  readonly norm?: { readonly weight: GPUBuffer; readonly eps: number };
  /** Read input row samples[i].row for output row i. */
  readonly samples?: GPUBufferBinding | GPUBuffer;
  /** What the "rope" epilogue needs: the head layout, rows (pos, slot), ropeTable(), KV pools. */
  readonly rope?: {
    readonly shape: RopeShape;
    readonly rows: GPUBufferBinding | GPUBuffer;
    readonly table: GPUBuffer;
    readonly kCache: GPUBuffer;
    readonly vCache: GPUBuffer;
    /** The q | k | v biases (f32, one per feature), when shape.bias is set. */
    readonly bias?: GPUBuffer;
  };
  /**
   * Attention as the prologue ({@link AttentionShape}): x is then the rows of q | k | v, and the
   * matrix multiplies their attention output; the step's rows, sequences and block tables, and
   * the KV pools.
   */
  readonly attention?: {
    readonly shape: AttentionShape;
    readonly rows: GPUBufferBinding | GPUBuffer;
    readonly seqs: GPUBufferBinding | GPUBuffer;
    readonly tables: GPUBufferBinding | GPUBuffer;
    readonly kCache: GPUBuffer;
    readonly vCache: GPUBuffer;
  };
  /**
   * Also write the final RMSNorm of each sampled row's new y into `out` ([samples, outputs]):
   * see {@link MatmulSpec.finalNorm}; the classifier then takes `out` as its normalized input.
   */
  readonly finalNorm?: {
    readonly weight: GPUBuffer;
    readonly eps: number;
    readonly samples: GPUBufferBinding | GPUBuffer;
    readonly out: GPUBuffer;
  };
  /** Floats per row of y (default: the matrix's output features). */
  readonly yStride?: number;
  /** Column of y receiving output feature 0 (default 0). */
  readonly yOffset?: number;
  /**
   * Work split: "split" (KS threads per output, partials combined in workgroup memory; suits
   * GPUs) or "lane" (a thread per output walking the row in order; suits CPU rasterizers).
   * Default: "lane" on a CPU rasterizer, else "split".
   */
  readonly layout?: MatmulLayout;
  /** Names the kernel in profiles (default: the matrix's name). */
  readonly label?: string;
}

/**
 * Binds a device matrix to its activations. A matrix split into chunks is one dispatch per
 * chunk, each writing its own columns of y.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { acquireGpu, readBuffer, uploadBuffer } from "./device.ts";
 * import { uploadMatrix } from "./gpu_matrix.ts";
 * import { DIM_ROWS } from "./step_meta.ts";
 *
 * const gpu = await acquireGpu();
 * const f32 = (values: number[]) => new Uint8Array(new Float32Array(values).buffer);
 * // W = [[1, 2, 3, 4], [5, 6, 7, 8]]: 2 outputs of 4 inputs (f32 rows come in fours).
 * const data = f32([1, 2, 3, 4, 5, 6, 7, 8]);
 * const w = uploadMatrix(gpu, { name: "w", type: "f32", shape: [2, 4], data });
 * const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC;
 * const x = uploadBuffer(gpu, new Float32Array([1, 1, 1, 1, 1, 0, 0, 0]), usage, "x"); // two rows
 * const y = uploadBuffer(gpu, new Float32Array(4), usage, "y");
 * // The step's dims (here only the row count, at DIM_ROWS); a norm: { weight, eps } would fuse
 * // an RMSNorm of x, an epilogue would add, SwiGLU or rotate instead of storing.
 * const dims = uploadBuffer(gpu, new Uint32Array(16).fill(2, DIM_ROWS, DIM_ROWS + 1),
 *   GPUBufferUsage.UNIFORM | GPUBufferUsage.STORAGE, "dims");
 * const op = createMatmul(gpu, w, { dims, x, y, rowsField: DIM_ROWS });
 * const enc = gpu.device.createCommandEncoder();
 * const pass = enc.beginComputePass();
 * op.encode(pass, 2);
 * pass.end();
 * gpu.device.queue.submit([enc.finish()]);
 * assertEquals([...new Float32Array(await readBuffer(gpu, y, 16))], [10, 26, 1, 5]); // W·x per row
 * ```
 */
export function createMatmul(gpu: Gpu, m: GpuMatrix, target: MatmulTarget): KernelOp {
  const epilogue = target.epilogue ?? "store";
  const dual = epilogue === "swiglu";
  if (dual && m.chunks.some((c) => c.rows % 2 !== 0)) {
    throw new Error(
      `Cannot bind matmul '${m.name}': a swiglu matrix needs whole gate/up row pairs in every chunk`,
    );
  }
  const spec: MatmulSpec = {
    type: m.type,
    cols: m.cols,
    group: m.group,
    rowsField: target.rowsField,
    epilogue,
    normEps: target.norm?.eps,
    gather: target.samples !== undefined,
    rope: target.rope?.shape,
    attention: target.attention?.shape,
    finalNorm: target.finalNorm && { eps: target.finalNorm.eps },
  };
  const lane = (target.layout ?? (gpu.cpuRasterizer ? "lane" : "split")) === "lane";
  const broadcast = lane && gpu.laneSubgroups && !target.attention && broadcastFits(m.type);
  if ((epilogue === "rope") !== (target.rope !== undefined)) {
    throw new Error(
      `Cannot bind matmul '${m.name}': the rope epilogue needs target.rope, and target.rope the rope epilogue (epilogue ${epilogue}, rope ${
        target.rope ? "given" : "missing"
      })`,
    );
  }
  if (target.attention) {
    const { nHeads, headDim } = target.attention.shape.config;
    if (!lane || m.cols !== nHeads * headDim) {
      throw new Error(
        `Cannot bind matmul '${m.name}': attention as its prologue needs the lane layout and ${
          nHeads * headDim
        } input columns (layout ${lane ? "lane" : "split"}, ${m.cols} columns)`,
      );
    }
  }
  if (target.finalNorm && !(lane && finalNormFits(m))) {
    throw new Error(
      `Cannot bind matmul '${m.name}' with the final norm in its epilogue: it needs the lane layout and one lane workgroup over all of its ${m.rows} outputs in one binding (layout ${
        lane ? "lane" : "split"
      }, ${m.chunks.length} chunks)`,
    );
  }
  if (epilogue === "rope" && m.chunks.some((c) => c.rows % 2 !== 0)) {
    throw new Error(`Cannot bind matmul '${m.name}': rope needs whole pairs in every chunk`);
  }
  const name = `matmul ${m.type} k=${m.cols} ${epilogue}${
    spec.attention ? " after attention" : ""
  }`;
  // The lane layout: one pipeline per row tile (LANE_TILES), picked per dispatch.
  const tiles: readonly number[] = lane ? LANE_TILES : [MATMUL_ROWS_PER_GROUP];
  const pipelines = lane
    ? LANE_TILES.map((t) =>
      gpu.pipeline(matmulLaneWgsl({ ...spec, broadcast }, t), `${name} tile ${t}`)
    )
    : [gpu.pipeline(matmulWgsl(spec), name)];
  const to = lane
    ? laneShape(m.type, dual).threads * laneShape(m.type, dual).outs
    : matmulSplit(m.type, m.cols, epilogue).to;
  const outputs = dual ? m.rows / 2 : m.rows;
  const parts = m.chunks.map((c) => {
    const n = dual ? c.rows / 2 : c.rows;
    const start = dual ? c.rowStart / 2 : c.rowStart;
    const params = uploadBuffer(
      gpu,
      new Uint32Array([n, target.yStride ?? outputs, (target.yOffset ?? 0) + start, 0]),
      GPUBufferUsage.UNIFORM,
      `${m.name} chunk params`,
    );
    const bound: [number, GPUBuffer | GPUBufferBinding][] = [
      [0, target.dims],
      [1, params],
      [2, c.buffer],
      [3, target.x],
      [4, target.y],
    ];
    if (needsVec4View(m.type)) bound.push([16, c.buffer]);
    if (target.norm) bound.push([5, target.norm.weight]);
    if (target.finalNorm) {
      const f = target.finalNorm;
      bound.push([5, f.weight], [6, f.samples], [15, f.out]);
    }
    if (target.samples) bound.push([6, target.samples]);
    if (target.rope) {
      bound.push(
        [7, target.rope.rows],
        [8, target.rope.table],
        [9, target.rope.kCache],
        [10, target.rope.vCache],
      );
      if (target.rope.shape.bias) {
        if (!target.rope.bias) {
          throw new Error(
            `Cannot bind matmul '${m.name}': the rope shape asks for a bias, none given`,
          );
        }
        bound.push([13, target.rope.bias]);
      }
    }
    if (target.attention) {
      const a = target.attention;
      bound.push([7, a.rows], [9, a.kCache], [10, a.vCache], [11, a.seqs], [12, a.tables]);
    }
    const entries = bound.map(([binding, b]) => ({
      binding,
      resource: b instanceof GPUBuffer ? { buffer: b } : b,
    }));
    const bindGroups = pipelines.map((pipeline) =>
      gpu.device.createBindGroup({
        layout: pipeline.getBindGroupLayout(0),
        entries,
        label: m.name,
      })
    );
    const groups = Math.ceil(n / to);
    const gy = Math.min(groups, gpu.maxWorkgroupsPerDimension);
    return { bindGroups, gy, gz: Math.ceil(groups / gy) };
  });
  return {
    label: `matmul ${target.label ?? m.name} ${m.type}`,
    cost(c) {
      const n = target.rowsField === DIM_SAMPLES ? c.samples.length : c.rows.length;
      const yBytes = n * outputs * 4 * (epilogue === "accumulate" ? 2 : 1);
      // The prologue's attention, counted once (as the separate kernel's cost would be).
      const att = target.attention?.shape;
      const keys = att ? c.rows.reduce((sum, r) => sum + r.pos + 1, 0) : 0;
      const attFlops = att ? 4 * att.config.nHeads * att.config.headDim * keys : 0;
      const attBytes = att
        ? 2 * att.config.nKvHeads * att.config.headDim * kvElementBytes(att.kvDtype) * keys
        : 0;
      return {
        flops: 2 * n * m.rows * m.cols + (target.norm ? 2 * n * m.cols : 0) + attFlops,
        bytes: m.rows * m.rowBytes + n * m.cols * 4 + yBytes + attBytes,
      };
    },
    encode(pass: GPUComputePassEncoder, rows: number): void {
      if (rows === 0) return;
      const tile = lane ? laneTile(rows) : MATMUL_ROWS_PER_GROUP;
      const t = tiles.indexOf(tile);
      pass.setPipeline(pipelines[t]!);
      const gx = Math.ceil(rows / tile);
      for (const p of parts) {
        pass.setBindGroup(0, p.bindGroups[t]!);
        pass.dispatchWorkgroups(gx, p.gy, p.gz);
      }
    },
  };
}

/**
 * Whether lane matmul `m` can write the final norm in its epilogue (MatmulSpec.finalNorm): it
 * sits in one binding and one workgroup spans all its outputs, so each holds whole rows of the
 * new y. Tiny models on CPU rasterizers; elsewhere the classifier's own norm pass runs.
 */
export function finalNormFits(m: Pick<GpuMatrix, "type" | "rows" | "chunks">): boolean {
  const { threads, outs } = laneShape(m.type);
  return m.chunks.length === 1 && threads * outs >= m.rows;
}

/**
 * Whether a type's lane kernels can share activations by subgroupBroadcast
 * (MatmulSpec.broadcast): each lane loads one vec4 of a chunk, so a chunk must be whole
 * multiples of the workgroup's lanes.
 */
export function broadcastFits(type: TensorType): boolean {
  return chunkVec4s(type) % LANE_THREADS === 0;
}

/**
 * WGSL binding `name`0 .. `name`{nv-1}, a chunk's vec4s that every lane of a lane workgroup
 * needs, loaded once a workgroup: lane sl loads vec4s sl, sl + 8, ... (`load(k)` for the
 * k-th, as `name`l{k}) and subgroupBroadcast hands each to every lane (MatmulSpec.broadcast).
 */
export function wgslSharedVec4s(name: string, nv: number, load: (k: number) => string): string {
  const loads = Array.from(
    { length: nv / LANE_THREADS },
    (_, k) => `let ${name}l${k} = ${load(k)};`,
  );
  const taken = Array.from(
    { length: nv },
    (_, i) =>
      `let ${name}${i} = subgroupBroadcast(${name}l${Math.floor(i / LANE_THREADS)}, ${
        i % LANE_THREADS
      }u);`,
  );
  return `${loads.join(" ")} ${taken.join(" ")}`;
}

/**
 * WGSL snippets both matmul layouts share for one chunk of `nv` vec4s: the RMSNorm weights, a
 * row's activations (normalized when fused), its sum of squares, and a dot product with them.
 * Chunk c of the input rows is read by "load" (every thread loads each vec4), "tile"
 * (from attention's workgroup tile A), or "broadcast" (lane sl loads vec4s sl, sl + 8, ... and
 * subgroupBroadcast hands each to every lane: on llvmpipe, where a storage load is a loop over
 * the lanes, a chunk's activations cost one load a lane instead of eight).
 */
function wgslChunkInputs(
  nv: number,
  norm: boolean,
  from: "load" | "tile" | "broadcast",
  /** The weights' quant offset, left out of their loads (chunkOffset): dotWith subtracts it. */
  offset = 0,
) {
  const vecs = (f: (i: number) => string, sep = " ") =>
    Array.from({ length: nv }, (_, i) => f(i)).join(sep);
  const shared = (name: string, load: (k: number) => string) => wgslSharedVec4s(name, nv, load);
  const lane = (k: number) => `c * ${nv}u + ${k * LANE_THREADS}u + sl`;
  return {
    normLoads: !norm
      ? ""
      : from === "broadcast"
      ? shared("nw", (k) => `NW[${lane(k)}]`)
      : vecs((i) => `let nw${i} = NW[c * ${nv}u + ${i}u];`),
    dotWith: (p: string) => vecs((i) => `dot(${p}${i}, x${i})`, " + ") + (offset ? " - sx" : ""),
    rowInputs: (r: number) => ({
      xs: from === "broadcast"
        ? shared("xr", (k) => `X[src${r} * XV + ${lane(k)}]`)
        : vecs((i) =>
          `let xr${i} = ${from === "tile" ? `A[${r}u` : `X[src${r}`} * XV + c * ${nv}u + ${i}u];`
        ),
      xw: vecs((i) => `let x${i} = ${norm ? `xr${i} * nw${i}` : `xr${i}`};`),
      // offset × the chunk's activation sum, once a row and chunk for every output's product.
      sx: offset
        ? `let sx = ${offset.toFixed(1)} * dot(${vecs((i) => `x${i}`, " + ")}, vec4<f32>(1.0));`
        : "",
      sumSq: norm ? `s${r} += ${vecs((i) => `dot(xr${i}, xr${i})`, " + ")};` : "",
    }),
  };
}
