import { BLOCK_LAYOUT, type Tensor, type TensorType } from "../../lib/model/tensor.ts";
import { type Gpu, uploadBuffer } from "./device.ts";
import {
  LANE_ROW_GROUP,
  rowBytes as deviceRowBytes,
  sameOnDevice,
  toDeviceRows,
} from "./weight_formats.ts";

/** Whole rows of a matrix in one buffer, small enough for one storage binding. */
export interface MatrixChunk {
  readonly buffer: GPUBuffer;
  readonly rowStart: number;
  readonly rows: number;
}

/**
 * A weight matrix [rows, cols] on the device in its file encoding (f32, f16, bf16 or any
 * block type, never expanded; 2-aligned blocks rearranged so every field is word-aligned, see DEVICE_LAYOUT in weight_formats.ts), split
 * by rows into chunks when it exceeds one binding.
 */
export interface GpuMatrix {
  readonly name: string;
  readonly type: TensorType;
  readonly rows: number;
  readonly cols: number;
  /** Bytes of one row on the device. */
  readonly rowBytes: number;
  /**
   * Rows interleaved in groups of this many (a power of two; wgslAt in weight_formats.ts):
   * LANE_ROW_GROUP on a CPU rasterizer, 1 (row-major) elsewhere. Every chunk starts a group.
   */
  readonly group: number;
  readonly chunks: readonly MatrixChunk[];
}

/** Bytes the kernels may read past a chunk's last block (sub-word fields read as a whole word). */
const TAIL_PAD = 4;

/** File bytes staged per copy when blocks are rearranged on the way to the device. */
const PAD_STAGING_BYTES = 1 << 20;

/**
 * A matrix's rows to upload, assembled from one or more tensors without being materialized:
 * the q | k | v stack and the interleaved gate/up pairs are written straight into the device
 * buffers, so uploading a model never holds a second copy of its big matrices on the host.
 */
export interface RowSource {
  readonly name: string;
  readonly type: TensorType;
  readonly shape: readonly number[];
  /** Bytes of all rows. */
  readonly byteLength: number;
  /** Writes rows [start, start + n) into `dst` (n whole rows). */
  copyRows(dst: Uint8Array, start: number, n: number): void;
}

function tensorRows(t: Tensor): RowSource {
  const rowBytes = t.data.byteLength / (t.shape[0] ?? 1);
  return {
    name: t.name,
    type: t.type,
    shape: t.shape,
    byteLength: t.data.byteLength,
    copyRows: (dst, start, n) => dst.set(t.data.subarray(start * rowBytes, (start + n) * rowBytes)),
  };
}

/**
 * Uploads a 2-D tensor's raw bytes (or a RowSource's rows), split into as few row ranges as the
 * binding limit allows. Throws when a single row would not fit in one binding.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { loadModel } from "../../lib/model/load_model.ts";
 * import { acquireGpu } from "./device.ts";
 *
 * const gpu = await acquireGpu();
 * const model = await loadModel("stories260K.bin");
 * const wq = uploadMatrix(gpu, model.weights.layers[0]!.wq); // f32 [64, 64]: 16 KiB, one chunk
 * assertEquals([wq.rows, wq.cols, wq.rowBytes, wq.chunks.length], [64, 64, 256, 1]);
 * destroyMatrix(wq);
 * ```
 */
export function uploadMatrix(
  gpu: Gpu,
  tensor: Tensor | RowSource,
  wantedGroup = gpu.cpuRasterizer ? LANE_ROW_GROUP : 1,
): GpuMatrix {
  const t = "copyRows" in tensor ? tensor : tensorRows(tensor);
  if (t.shape.length !== 2) {
    throw new Error(
      `Cannot upload matrix '${t.name}': expected 2 dimensions, received shape [${
        t.shape.join(", ")
      }]`,
    );
  }
  const [rows, cols] = t.shape as [number, number];
  const { elements, bytes } = BLOCK_LAYOUT[t.type];
  // Float types are read a vec4 at a time; blocks whole.
  const unit = Math.max(4, elements);
  if (cols % unit !== 0) {
    throw new Error(
      `Cannot upload matrix '${t.name}': the kernels need its inner dimension to be a multiple of ${unit} for type ${t.type}, received shape [${rows}, ${cols}]`,
    );
  }
  const fileRowBytes = (cols / elements) * bytes;
  if (t.byteLength !== rows * fileRowBytes) {
    throw new Error(
      `Cannot upload matrix '${t.name}': ${t.type} [${rows}, ${cols}] needs ${
        rows * fileRowBytes
      } bytes, received ${t.byteLength}`,
    );
  }
  const rowBytes = deviceRowBytes(t.type, cols);
  const fit = Math.floor((gpu.maxBindingBytes - TAIL_PAD - 4) / rowBytes);
  if (fit < 1) {
    throw new Error(
      `Cannot upload matrix '${t.name}': one row of ${rowBytes} bytes exceeds the device's binding limit of ${gpu.maxBindingBytes} bytes`,
    );
  }
  // A group never spans two chunks, so it is as large as one binding allows.
  let group = 1;
  while (group * 2 <= Math.min(wantedGroup, fit)) group *= 2;
  // Whole groups, and even, so interleaved gate/up row pairs never straddle two chunks.
  const rowsPerChunk = group > 1 ? fit - (fit % group) : fit > 1 ? fit - (fit % 2) : fit;
  const stageRows = Math.max(group, Math.floor(PAD_STAGING_BYTES / fileRowBytes / group) * group);
  const staging = sameOnDevice(t.type) && group === 1
    ? undefined
    : new Uint8Array(Math.min(rows, stageRows) * fileRowBytes);
  const chunks: MatrixChunk[] = [];
  for (let rowStart = 0; rowStart < rows; rowStart += rowsPerChunk) {
    const n = Math.min(rowsPerChunk, rows - rowStart);
    const label = chunks.length === 0 && n === rows
      ? t.name
      : `${t.name}[${rowStart}..${rowStart + n})`;
    // Rows go from the file's bytes into the mapped buffer: no host copy in between, or a
    // small staging one when the blocks are rearranged.
    // A last partial group takes a whole group's bytes.
    const deviceRows = Math.ceil(n / group) * group;
    const size = Math.max(4, Math.ceil((deviceRows * rowBytes + TAIL_PAD) / 4) * 4);
    const buffer = gpu.device.createBuffer({
      size,
      usage: GPUBufferUsage.STORAGE,
      label,
      mappedAtCreation: true,
    });
    const mapped = new Uint8Array(buffer.getMappedRange(), 0, deviceRows * rowBytes);
    if (!staging) t.copyRows(mapped, rowStart, n);
    for (let r = 0; staging && r < n; r += stageRows) {
      const k = Math.min(stageRows, n - r);
      t.copyRows(staging, rowStart + r, k);
      toDeviceRows(
        t.type,
        cols,
        staging.subarray(0, k * fileRowBytes),
        mapped.subarray(r * rowBytes),
        group,
      );
    }
    buffer.unmap();
    chunks.push({ buffer, rowStart, rows: n });
  }
  return { name: t.name, type: t.type, rows, cols, rowBytes, group, chunks };
}

/** Whether these matrices can be stacked into one (same encoding and row length). */
export function stackable(ts: readonly Tensor[]): boolean {
  const a = ts[0]!;
  return ts.every((t) => t.type === a.type && t.shape.length === 2 && t.shape[1] === a.shape[1]);
}

/** Rows of a, then of b, ... as one matrix (q, k and v projections become one matmul). */
export function concatRows(ts: readonly Tensor[], name: string): RowSource {
  if (!stackable(ts)) {
    throw new Error(
      `Cannot stack ${
        ts.map((t) => `'${t.name}' ${t.type} [${t.shape.join(", ")}]`).join(", ")
      }: types and row lengths differ`,
    );
  }
  const rowBytes = ts[0]!.data.byteLength / ts[0]!.shape[0]!;
  const starts: number[] = [];
  let rows = 0;
  for (const t of ts) {
    starts.push(rows);
    rows += t.shape[0]!;
  }
  return {
    name,
    type: ts[0]!.type,
    shape: [rows, ts[0]!.shape[1]!],
    byteLength: rows * rowBytes,
    copyRows(dst, start, n) {
      // Each part's overlap with [start, start + n), in order.
      ts.forEach((t, i) => {
        const from = Math.max(start, starts[i]!);
        const to = Math.min(start + n, starts[i]! + t.shape[0]!);
        if (from >= to) return;
        const local = from - starts[i]!;
        dst.set(
          t.data.subarray(local * rowBytes, (local + to - from) * rowBytes),
          (from - start) * rowBytes,
        );
      });
    },
  };
}

/** Rows a0, b0, a1, b1, ...: gate and up rows side by side for the fused SwiGLU matmul. */
export function interleaveRows(a: Tensor, b: Tensor, name: string): RowSource {
  if (!stackable([a, b]) || a.shape[0] !== b.shape[0]) {
    throw new Error(
      `Cannot interleave '${a.name}' ${a.type} [${
        a.shape.join(", ")
      }] with '${b.name}' ${b.type} [${b.shape.join(", ")}]: shapes or types differ`,
    );
  }
  const rows = a.shape[0]!;
  const rb = a.data.byteLength / rows;
  return {
    name,
    type: a.type,
    shape: [2 * rows, a.shape[1]!],
    byteLength: 2 * a.data.byteLength,
    copyRows(dst, start, n) {
      for (let r = start; r < start + n; r++) {
        const src = r % 2 === 0 ? a : b;
        const k = r >> 1;
        dst.set(src.data.subarray(k * rb, (k + 1) * rb), (r - start) * rb);
      }
    },
  };
}

/** Expands a small vector (norm weights) to f32 and uploads it. */
export function uploadVector(gpu: Gpu, values: Float32Array, label: string): GPUBuffer {
  return uploadBuffer(gpu, values, GPUBufferUsage.STORAGE, label);
}

/** Frees every chunk. */
export function destroyMatrix(m: GpuMatrix): void {
  for (const c of m.chunks) c.buffer.destroy();
}
