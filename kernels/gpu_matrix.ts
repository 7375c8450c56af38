import { BLOCK_LAYOUT, type Tensor, type TensorType } from "../lib/model/tensor.ts";
import { type Gpu, uploadBuffer } from "./device.ts";
import { GPU_TENSOR_TYPES } from "./weight_formats.ts";

/** Whole rows of a matrix in one buffer, small enough for one storage binding. */
export interface MatrixChunk {
  readonly buffer: GPUBuffer;
  readonly rowStart: number;
  readonly rows: number;
}

/**
 * A weight matrix [rows, cols] on the device in its file encoding (f32, f16, Q8_0 or Q4_0
 * blocks, never expanded), split by rows into chunks when it exceeds one binding.
 */
export interface GpuMatrix {
  readonly name: string;
  readonly type: TensorType;
  readonly rows: number;
  readonly cols: number;
  readonly rowBytes: number;
  readonly chunks: readonly MatrixChunk[];
}

/** Bytes the kernels may read past a chunk's last block (a Q8_0/Q4_0 block read as whole words). */
const TAIL_PAD = 4;

/**
 * Uploads a 2-D tensor's raw bytes, split into as few row ranges as the binding limit allows.
 * Throws when a single row would not fit in one binding.
 *
 * ```ts
 * const wq = uploadMatrix(gpu, layer.wq);
 * ```
 */
export function uploadMatrix(gpu: Gpu, t: Tensor): GpuMatrix {
  if (t.shape.length !== 2) {
    throw new Error(
      `Cannot upload matrix '${t.name}': expected 2 dimensions, received shape [${
        t.shape.join(", ")
      }]`,
    );
  }
  const [rows, cols] = t.shape as [number, number];
  if (!GPU_TENSOR_TYPES.includes(t.type)) {
    throw new Error(
      `Cannot upload matrix '${t.name}': the WebGPU kernels read ${
        GPU_TENSOR_TYPES.join(", ")
      } weights, received ${t.type} (the CPU backend reads it)`,
    );
  }
  const { elements, bytes } = BLOCK_LAYOUT[t.type];
  const quantized = t.type === "q8_0" || t.type === "q4_0";
  if ((quantized && cols % 32 !== 0) || cols % 4 !== 0) {
    throw new Error(
      `Cannot upload matrix '${t.name}': the kernels need its inner dimension to be a multiple of ${
        quantized ? 32 : 4
      } for type ${t.type}, received shape [${rows}, ${cols}]`,
    );
  }
  const rowBytes = (cols / elements) * bytes;
  if (t.data.byteLength !== rows * rowBytes) {
    throw new Error(
      `Cannot upload matrix '${t.name}': ${t.type} [${rows}, ${cols}] needs ${
        rows * rowBytes
      } bytes, received ${t.data.byteLength}`,
    );
  }
  const fit = Math.floor((gpu.maxBindingBytes - TAIL_PAD - 4) / rowBytes);
  // Even, so interleaved gate/up row pairs never straddle two chunks.
  const rowsPerChunk = fit > 1 ? fit - (fit % 2) : fit;
  if (rowsPerChunk < 1) {
    throw new Error(
      `Cannot upload matrix '${t.name}': one row of ${rowBytes} bytes exceeds the device's binding limit of ${gpu.maxBindingBytes} bytes`,
    );
  }
  const chunks: MatrixChunk[] = [];
  for (let rowStart = 0; rowStart < rows; rowStart += rowsPerChunk) {
    const n = Math.min(rowsPerChunk, rows - rowStart);
    const data = t.data.subarray(rowStart * rowBytes, (rowStart + n) * rowBytes);
    const label = chunks.length === 0 && n === rows
      ? t.name
      : `${t.name}[${rowStart}..${rowStart + n})`;
    chunks.push({
      buffer: uploadBuffer(gpu, data, GPUBufferUsage.STORAGE, label, TAIL_PAD),
      rowStart,
      rows: n,
    });
  }
  return { name: t.name, type: t.type, rows, cols, rowBytes, chunks };
}

/** Whether these matrices can be stacked into one (same encoding and row length). */
export function stackable(ts: readonly Tensor[]): boolean {
  const a = ts[0]!;
  return ts.every((t) => t.type === a.type && t.shape.length === 2 && t.shape[1] === a.shape[1]);
}

/** Rows of a, then of b, ... as one tensor (q, k and v projections become one matmul). */
export function concatRows(ts: readonly Tensor[], name: string): Tensor {
  if (!stackable(ts)) {
    throw new Error(
      `Cannot stack ${
        ts.map((t) => `'${t.name}' ${t.type} [${t.shape.join(", ")}]`).join(", ")
      }: types and row lengths differ`,
    );
  }
  const data = new Uint8Array(ts.reduce((s, t) => s + t.data.byteLength, 0));
  let at = 0;
  for (const t of ts) {
    data.set(t.data, at);
    at += t.data.byteLength;
  }
  return {
    name,
    type: ts[0]!.type,
    shape: [ts.reduce((s, t) => s + t.shape[0]!, 0), ts[0]!.shape[1]!],
    data,
  };
}

/** Rows a0, b0, a1, b1, ...: gate and up rows side by side for the fused SwiGLU matmul. */
export function interleaveRows(a: Tensor, b: Tensor, name: string): Tensor {
  if (!stackable([a, b]) || a.shape[0] !== b.shape[0]) {
    throw new Error(
      `Cannot interleave '${a.name}' ${a.type} [${
        a.shape.join(", ")
      }] with '${b.name}' ${b.type} [${b.shape.join(", ")}]: shapes or types differ`,
    );
  }
  const rows = a.shape[0]!;
  const rb = a.data.byteLength / rows;
  const data = new Uint8Array(2 * a.data.byteLength);
  for (let r = 0; r < rows; r++) {
    data.set(a.data.subarray(r * rb, (r + 1) * rb), 2 * r * rb);
    data.set(b.data.subarray(r * rb, (r + 1) * rb), (2 * r + 1) * rb);
  }
  return { name, type: a.type, shape: [2 * rows, a.shape[1]!], data };
}

/** Expands a small vector (norm weights) to f32 and uploads it. */
export function uploadVector(gpu: Gpu, values: Float32Array, label: string): GPUBuffer {
  return uploadBuffer(gpu, values, GPUBufferUsage.STORAGE, label);
}

/** Frees every chunk. */
export function destroyMatrix(m: GpuMatrix): void {
  for (const c of m.chunks) c.buffer.destroy();
}
