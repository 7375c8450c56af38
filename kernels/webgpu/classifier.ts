import type { TensorType } from "../../lib/model/tensor.ts";
import type { Gpu, KernelOp } from "./device.ts";
import type { GpuMatrix } from "./gpu_matrix.ts";
import {
  broadcastFits,
  createMatmul,
  LANE_TILES,
  laneShape,
  laneTile,
  wgslChunkBindings,
  wgslRowTileMain,
  wgslSharedVec4s,
} from "./matmul.ts";
import { DIM_SAMPLES, WGSL_STEP_TYPES } from "./step_meta.ts";
import { q6kHalfLoop } from "./q6k_half_loop.ts";
import { chunkVec4s, needsVec4View, wgslLoadChunk } from "./weight_formats.ts";

/**
 * The vocabulary-sized last matmul: logits[i] = W · RMSNorm(x[samples[i].row]) for the few
 * rows that sample, against 100k+ outputs. The layer matmuls are shaped for many token rows
 * against a few thousand outputs; here the shape is the other way round, so:
 *
 * - the final norm runs once per sampled row into a compact buffer (one small dispatch)
 *   instead of inside every workgroup of the matmul, which would redo it 4,000 times;
 * - workgroups cover output rows (over the y and z grid dimensions, so 150k outputs never
 *   meet the 65,535-workgroup limit of one dimension), and each walks one row's blocks: the
 *   only loop is over the row's blocks, far from llvmpipe's 65,535-iteration cap;
 * - on CPU rasterizers the row tile (sampled rows per pass over the weights) is chosen per
 *   step from the number of rows: one row needs no unrolled 8-row tile, whose code costs
 *   more than it saves there (measured on llvmpipe, bench/README "Classifier").
 */

/**
 * The tile of rows a step of `rows` sampled rows runs with (the lane matmul's tiles and rule,
 * LANE_TILES), and how many passes over the weights it takes.
 */
export function classifierTile(rows: number): { tile: number; passes: number } {
  const tile = laneTile(rows);
  return { tile, passes: Math.ceil(rows / tile) };
}

/**
 * WGSL writing Xn[i] = x[samples[i].row] · w / rms for i < dims[DIM_SAMPLES]: one workgroup
 * per sampled row, 64 threads summing fixed strided parts of x², added in a fixed tree order,
 * so a row's result never depends on the other rows of the step (batch invariance).
 */
export function classifierNormWgsl(cols: number, eps: number): string {
  return /* wgsl */ `
${WGSL_STEP_TYPES}
@group(0) @binding(0) var<uniform> dims: vec4<u32>;
@group(0) @binding(1) var<storage, read> samples: array<Sample>;
@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> NW: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> Xn: array<vec4<f32>>;
const XV = ${cols / 4}u;
var<workgroup> part: array<f32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let i = wid.x;
  if (i >= dims[${DIM_SAMPLES}]) { return; }
  let src = samples[i].row * XV;
  var s = 0.0;
  for (var c = t; c < XV; c += 64u) { let v = X[src + c]; s += dot(v, v); }
  part[t] = s;
  workgroupBarrier();
  for (var h = 32u; h > 0u; h >>= 1u) {
    if (t < h) { part[t] += part[t + h]; }
    workgroupBarrier();
  }
  let scale = 1.0 / sqrt(part[0] / ${cols}.0 + ${eps.toExponential()});
  for (var c = t; c < XV; c += 64u) { Xn[i * XV + c] = X[src + c] * NW[c] * scale; }
}
`;
}

/**
 * WGSL for Y[r * yStride + yOffset + o] = Σ_k W[o, k] · Xn[r, k] for r in [r0, r0 + tile):
 * lane t of a workgroup owns outputs base + j·8 + t (adjacent lanes, adjacent rows) and walks
 * the row's chunks in order, so each sum is one sequential chain (batch invariant), with no
 * workgroup memory and no barrier. Rows are unrolled (no dynamically indexed private array).
 */
export function classifierLaneWgsl(
  type: TensorType,
  cols: number,
  tile: number,
  group = 1,
  broadcast = false,
): string {
  // The lane matmul's workgroup: 8 lanes (one SIMD batch of llvmpipe's 256-bit vectors), each
  // owning fewer outputs for block types, whose dequantization is long code.
  const { threads, outs } = laneShape(type);
  const nv = chunkVec4s(type);
  const js = Array.from({ length: outs }, (_, j) => j);
  const rows = Array.from({ length: tile }, (_, r) => r);
  const vecs = (f: (i: number) => string, sep = " ") =>
    Array.from({ length: nv }, (_, i) => f(i)).join(sep);
  if (broadcast && !broadcastFits(type)) {
    throw new Error(
      `Cannot build a classifier that broadcasts activations for ${type}: it needs chunks of a multiple of ${threads} vec4s`,
    );
  }
  const perRow = rows.map((r) => {
    const xs = broadcast
      ? wgslSharedVec4s("x", nv, (k) => `Xn[(r0 + ${r}u) * XV + c * ${nv}u + ${k * threads}u + sl]`)
      : vecs((i) => `let x${i} = Xn[(r0 + ${r}u) * XV + c * ${nv}u + ${i}u];`);
    const acc = js.map((j) =>
      `a${j}_${r} += w${j}d * (${vecs((i) => `dot(w${j}${i}, x${i})`, " + ")});`
    )
      .join(" ");
    return tile === 1 ? `{ ${xs} ${acc} }` : `if (${r}u < live) { ${xs} ${acc} }`;
  }).join("\n      ");
  const stores = rows.map((r) =>
    `if (${r}u < live) { ${
      js.map((j) =>
        `if (o${j} < chunk.rows) { Y[(r0 + ${r}u) * chunk.yStride + chunk.yOffset + o${j}] = a${j}_${r}; }`
      ).join(" ")
    } }`
  ).join("\n  ");
  return /* wgsl */ `
${wgslChunkBindings(type, 5, "Xn")}
${wgslRowTileMain({ type, cols, threads, broadcast, rows: `dims[${DIM_SAMPLES}]`, tile })}
  let base = (wid.y + wid.z * nwg.y) * ${threads * outs}u + t;
  // Lanes past the last output compute a copy of it and store nothing: no divergent branch.
  ${
    js.map((j) => `let o${j} = base + ${j * threads}u; let oc${j} = min(o${j}, chunk.rows - 1u);`)
      .join("\n  ")
  }
  ${rows.map((r) => js.map((j) => `var a${j}_${r} = 0.0;`).join(" ")).join("\n  ")}
  ${
    type === "q6_k"
      ? q6kHalfLoop(cols, tile, outs, group, broadcast, (r, v) => `Xn[(r0 + ${r}u) * XV + ${v}]`)
      : `for (var c = 0u; c < NCHUNK; c++) {
      ${js.map((j) => wgslLoadChunk(type, cols, `oc${j}`, `w${j}`, group)).join("\n      ")}
      ${perRow}
  }`
  }
  ${stores}
}
`;
}

/** Where the classifier reads and writes. */
export interface ClassifierTarget {
  /** The step's dims uniform (the sampled-row count at DIM_SAMPLES). */
  readonly dims: GPUBuffer | GPUBufferBinding;
  /** The step's samples section: row i of the output reads x row samples[i].row. */
  readonly samples: GPUBuffer | GPUBufferBinding;
  /** Activations [token rows, cols] f32. */
  readonly x: GPUBuffer;
  /** Logits [maxRows, matrix rows] f32. */
  readonly y: GPUBuffer;
  /** The final RMSNorm's f32 weights [cols] and epsilon (or `normalized`). */
  readonly norm?: { readonly weight: GPUBuffer; readonly eps: number };
  /**
   * Instead of `norm`: the sampled rows already normalized, [maxRows, cols] (the last layer's
   * down projection wrote them, MatmulTarget.finalNorm): no norm dispatch of its own.
   */
  readonly normalized?: GPUBuffer;
  /** Sampled rows one step may have at most (sizes the normalized-input buffer). */
  readonly maxRows: number;
  /** Default: "lane" on a CPU rasterizer, else the split matmul (threads share each row). */
  readonly layout?: "lane" | "split";
}

const bufferBinding = (b: GPUBuffer | GPUBufferBinding): GPUBufferBinding =>
  b instanceof GPUBuffer ? { buffer: b } : b;

/**
 * Binds the classifier: the final norm of the sampled rows, then the matmul over every
 * output. One op of two dispatches (norm, matmul; more where the matrix is split into chunks).
 *
 * ```ts
 * import { assertAlmostEquals } from "@std/assert";
 * import { acquireGpu, readBuffer, uploadBuffer } from "./device.ts";
 * import { uploadMatrix } from "./gpu_matrix.ts";
 * import { DIM_SAMPLES, SAMPLE_WORDS } from "./step_meta.ts";
 *
 * const gpu = await acquireGpu();
 * const f32 = (values: number[]) => new Uint8Array(new Float32Array(values).buffer);
 * // 2 outputs of 4 inputs; token rows 0 and 1 of x, of which only row 1 samples.
 * const w = uploadMatrix(gpu, { name: "w", type: "f32", shape: [2, 4], data: f32([1, 2, 3, 4, 1, 0, 0, 0]) });
 * const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC;
 * const x = uploadBuffer(gpu, new Float32Array([9, 9, 9, 9, 2, 2, 2, 2]), usage, "x");
 * const y = uploadBuffer(gpu, new Float32Array(2), usage, "logits");
 * const dims = uploadBuffer(gpu, new Uint32Array(16).fill(1, DIM_SAMPLES, DIM_SAMPLES + 1),
 *   GPUBufferUsage.UNIFORM | GPUBufferUsage.STORAGE, "dims");
 * const samples = uploadBuffer(gpu, new Uint32Array(SAMPLE_WORDS).fill(1, 0, 1), GPUBufferUsage.STORAGE, "samples");
 * const weight = uploadBuffer(gpu, new Float32Array([1, 1, 1, 1]), GPUBufferUsage.STORAGE, "norm");
 * const op = createClassifier(gpu, w, { dims, samples, x, y, norm: { weight, eps: 0 }, maxRows: 1 });
 * const enc = gpu.device.createCommandEncoder();
 * const pass = enc.beginComputePass();
 * op.encode(pass, 1);
 * pass.end();
 * gpu.device.queue.submit([enc.finish()]);
 * // RMSNorm([2, 2, 2, 2]) = [1, 1, 1, 1]; W · it = [10, 1].
 * const logits = new Float32Array(await readBuffer(gpu, y, 8));
 * assertAlmostEquals(logits[0]!, 10, 1e-5);
 * assertAlmostEquals(logits[1]!, 1, 1e-5);
 * ```
 */
export function createClassifier(
  gpu: Gpu,
  m: GpuMatrix,
  target: ClassifierTarget,
): KernelOp & { destroy(): void } {
  const { device } = gpu;
  const lane = (target.layout ?? (gpu.cpuRasterizer ? "lane" : "split")) === "lane";
  const { norm, normalized } = target;
  if ((norm === undefined) === (normalized === undefined)) {
    throw new Error(
      `Cannot bind classifier '${m.name}': give the final norm or the normalized rows, exactly one (norm ${
        norm ? "given" : "missing"
      }, normalized ${normalized ? "given" : "missing"})`,
    );
  }
  const xn = normalized ?? device.createBuffer({
    size: Math.max(1, target.maxRows) * m.cols * 4,
    usage: GPUBufferUsage.STORAGE,
    label: `${m.name} normalized input`,
  });
  let encodeNorm = (_pass: GPUComputePassEncoder, _rows: number) => {};
  if (norm) {
    const normPipeline = gpu.pipeline(
      classifierNormWgsl(m.cols, norm.eps),
      `classifier norm k=${m.cols}`,
    );
    const normGroup = device.createBindGroup({
      layout: normPipeline.getBindGroupLayout(0),
      entries: [target.dims, target.samples, target.x, norm.weight, xn].map((b, binding) => ({
        binding,
        resource: bufferBinding(b),
      })),
      label: `${m.name} norm`,
    });
    encodeNorm = (pass, rows) => {
      pass.setPipeline(normPipeline);
      pass.setBindGroup(0, normGroup);
      pass.dispatchWorkgroups(rows);
    };
  }
  // A buffer the caller gave stays the caller's.
  const destroyXn = () => {
    if (!normalized) xn.destroy();
  };
  const cost: KernelOp["cost"] = (c) => {
    const n = c.samples.length;
    return {
      flops: 2 * n * m.rows * m.cols + 4 * n * m.cols,
      bytes: m.rows * m.rowBytes + 3 * n * m.cols * 4 + n * m.rows * 4,
    };
  };
  const label = `classifier ${m.type}`;
  // The op: the final norm (where the rows come unnormalized), then the matvec over Xn.
  const normThen = (
    encodeRows: (pass: GPUComputePassEncoder, rows: number) => void,
    destroyOwn: () => void,
  ): KernelOp & { destroy(): void } => ({
    label,
    cost,
    encode(pass, rows) {
      if (rows === 0) return;
      encodeNorm(pass, rows);
      encodeRows(pass, rows);
    },
    destroy() {
      destroyXn();
      destroyOwn();
    },
  });
  if (!lane) {
    // GPUs: the split matmul over the compact normalized rows (row i of Xn is sample i).
    const matmul = createMatmul(gpu, m, {
      dims: target.dims,
      x: xn,
      y: target.y,
      rowsField: DIM_SAMPLES,
      layout: "split",
    });
    return normThen((pass, rows) => matmul.encode(pass, rows), () => {});
  }
  const pipelines = LANE_TILES.map((tile) =>
    gpu.pipeline(
      classifierLaneWgsl(
        m.type,
        m.cols,
        tile,
        m.group,
        gpu.laneSubgroups && broadcastFits(m.type),
      ),
      `classifier ${m.type} k=${m.cols} tile ${tile}`,
    )
  );
  const { threads, outs } = laneShape(m.type);
  const perGroup = threads * outs;
  const parts = m.chunks.map((c) => {
    const params = device.createBuffer({
      size: 16,
      usage: GPUBufferUsage.UNIFORM,
      label: `${m.name} chunk params`,
      mappedAtCreation: true,
    });
    new Uint32Array(params.getMappedRange()).set([c.rows, m.rows, c.rowStart, 0]);
    params.unmap();
    const groups = Math.ceil(c.rows / perGroup);
    const gy = Math.min(groups, gpu.maxWorkgroupsPerDimension);
    const bindGroups = pipelines.map((p) =>
      device.createBindGroup({
        layout: p.getBindGroupLayout(0),
        entries: [
          target.dims,
          params,
          c.buffer,
          xn,
          target.y,
          ...(needsVec4View(m.type) ? [c.buffer] : []),
        ].map((b, binding) => ({
          binding,
          resource: bufferBinding(b),
        })),
        label: m.name,
      })
    );
    return { params, bindGroups, gy, gz: Math.ceil(groups / gy) };
  });
  return normThen((pass, rows) => {
    const { tile, passes } = classifierTile(rows);
    const t = LANE_TILES.indexOf(tile as (typeof LANE_TILES)[number]);
    pass.setPipeline(pipelines[t]!);
    for (const p of parts) {
      pass.setBindGroup(0, p.bindGroups[t]!);
      pass.dispatchWorkgroups(passes, p.gy, p.gz);
    }
  }, () => {
    for (const p of parts) p.params.destroy();
  });
}
