import type { TensorType } from "../lib/tensor.ts";
import { bindAll, type Gpu, uploadBuffer } from "./device.ts";
import type { GpuMatrix } from "./gpu_matrix.ts";
import { chunkElements, WGSL_WEIGHT_HELPERS, wgslMatmulBody } from "./weight_formats.ts";

/** Activation rows one workgroup multiplies against each weight chunk it loads. */
export const MATMUL_ROWS_PER_GROUP = 8;
const THREADS = 64;

/** How a matmul's 64 threads split the work: TO output features x KS slices along the row. */
export function matmulSplit(type: TensorType, cols: number): { ks: number; to: number } {
  const chunks = cols / chunkElements(type);
  let ks = 1;
  while (ks * 2 <= Math.min(THREADS, chunks)) ks *= 2;
  return { ks, to: THREADS / ks };
}

/** What y = W·x does with its result. */
export type MatmulEpilogue = "store" | "accumulate";

/**
 * WGSL for Y[r, yOffset + o] (=|+=) Σ_k W[o, k] X[r, k] over the rows r < dims[rowsField].
 * Each output is reduced by KS threads, each summing a fixed strided set of chunks, then a
 * fixed tree: a row's result never depends on which rows share its workgroup.
 */
export function matmulWgsl(type: TensorType, cols: number, rowsField: number, epilogue: MatmulEpilogue): string {
  const { ks, to } = matmulSplit(type, cols);
  const tr = MATMUL_ROWS_PER_GROUP;
  const wType = type === "f32" ? "array<vec4<f32>>" : "array<u32>";
  return /* wgsl */ `
struct Chunk { rows: u32, yStride: u32, yOffset: u32, unused: u32 }
@group(0) @binding(0) var<uniform> dims: vec4<u32>;
@group(0) @binding(1) var<uniform> chunk: Chunk;
@group(0) @binding(2) var<storage, read> W: ${wType};
@group(0) @binding(3) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> Y: array<f32>;
const KS = ${ks}u;
const TO = ${to}u;
const TR = ${tr}u;
const NCHUNK = ${cols / chunkElements(type)}u;
const XV = ${cols / 4}u;
var<workgroup> part: array<f32, ${THREADS * tr}>;
${type === "f32" ? "" : WGSL_WEIGHT_HELPERS}
@compute @workgroup_size(${THREADS})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let nRows = dims[${rowsField}];
  let r0 = wg.y * TR;
  let o = (wg.x + wg.z * nwg.x) * TO + t / KS;
  let s = t % KS;
  var acc: array<f32, TR>;
  if (o < chunk.rows && r0 < nRows) {
    for (var c = s; c < NCHUNK; c += KS) {${wgslMatmulBody(type, cols)}
    }
  }
  for (var r = 0u; r < TR; r++) { part[r * ${THREADS}u + t] = acc[r]; }
  workgroupBarrier();
  for (var h = KS / 2u; h > 0u; h >>= 1u) {
    if (s < h) {
      for (var r = 0u; r < TR; r++) { part[r * ${THREADS}u + t] += part[r * ${THREADS}u + t + h]; }
    }
    workgroupBarrier();
  }
  if (s == 0u && o < chunk.rows) {
    for (var r = 0u; r < TR; r++) {
      if (r0 + r >= nRows) { break; }
      let yi = (r0 + r) * chunk.yStride + chunk.yOffset + o;
      ${epilogue === "accumulate" ? "Y[yi] = Y[yi] + part[r * " + THREADS + "u + t];" : "Y[yi] = part[r * " + THREADS + "u + t];"}
    }
  }
}
`;
}

/** Where a matmul reads and writes. */
export interface MatmulTarget {
  /** The step's dims uniform (or any buffer holding the row count at rowsField). */
  readonly dims: GPUBuffer | GPUBufferBinding;
  readonly x: GPUBuffer;
  readonly y: GPUBuffer;
  /** Index into dims of the row count. */
  readonly rowsField: number;
  readonly epilogue?: MatmulEpilogue;
  /** Floats per row of y (default: the matrix's row count). */
  readonly yStride?: number;
  /** Column of y receiving output feature 0 (default 0). */
  readonly yOffset?: number;
}

/** A matmul with its buffers bound: y[r, :] = W·x[r, :] for r < rows. */
export interface MatmulOp {
  encode(pass: GPUComputePassEncoder, rows: number): void;
}

/**
 * Binds a device matrix to its activations. A matrix split into chunks is one dispatch per
 * chunk, each writing its own columns of y.
 *
 * ```ts
 * const q = createMatmul(gpu, wq, { dims, x: xb, y: q, rowsField: DIM_ROWS });
 * q.encode(pass, nRows);
 * ```
 */
export function createMatmul(gpu: Gpu, m: GpuMatrix, target: MatmulTarget): MatmulOp {
  const pipeline = gpu.pipeline(
    matmulWgsl(m.type, m.cols, target.rowsField, target.epilogue ?? "store"),
    `matmul ${m.type} k=${m.cols}`,
  );
  const { to } = matmulSplit(m.type, m.cols);
  const parts = m.chunks.map((c) => {
    const params = uploadBuffer(
      gpu,
      new Uint32Array([c.rows, target.yStride ?? m.rows, (target.yOffset ?? 0) + c.rowStart, 0]),
      GPUBufferUsage.UNIFORM,
      `${m.name} chunk params`,
    );
    const bindGroup = bindAll(gpu, pipeline, [target.dims, params, c.buffer, target.x, target.y], m.name);
    const groups = Math.ceil(c.rows / to);
    const gx = Math.min(groups, gpu.maxWorkgroupsPerDimension);
    return { bindGroup, gx, gz: Math.ceil(groups / gx) };
  });
  return {
    encode(pass: GPUComputePassEncoder, rows: number): void {
      if (rows === 0) return;
      pass.setPipeline(pipeline);
      const gy = Math.ceil(rows / MATMUL_ROWS_PER_GROUP);
      for (const p of parts) {
        pass.setBindGroup(0, p.bindGroup);
        pass.dispatchWorkgroups(p.gx, gy, p.gz);
      }
    },
  };
}
