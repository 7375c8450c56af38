/** Test helpers for GPU kernels: one device per test file, buffers from arrays, random data. */
import { acquireGpu, type Gpu, readBuffer, uploadBuffer } from "../kernels/webgpu/device.ts";
import { f32ToF16 } from "../lib/model/dequantize.ts";
import { BLOCK_LAYOUT, type Tensor, type TensorType } from "../lib/model/tensor.ts";
import { type StepContent, StepMetaLayout } from "../kernels/webgpu/step_meta.ts";
import { seededRandom } from "../lib/util/seeded_random.ts";

let shared: Promise<Gpu> | undefined;

/** The test file's device (created on first use, with an optional binding cap). */
export function testGpu(): Promise<Gpu> {
  shared ??= acquireGpu();
  return shared;
}

const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;

/** A storage buffer holding `data`. */
export function storage(gpu: Gpu, data: ArrayBufferView, label = "test"): GPUBuffer {
  return uploadBuffer(gpu, data, STORAGE, label);
}

/** A zeroed storage buffer of `bytes`. */
export function zeros(gpu: Gpu, bytes: number, label = "test"): GPUBuffer {
  return gpu.device.createBuffer({
    size: Math.max(4, Math.ceil(bytes / 4) * 4),
    usage: STORAGE,
    label,
  });
}

export async function readF32(gpu: Gpu, b: GPUBuffer, n: number): Promise<Float32Array> {
  return new Float32Array(await readBuffer(gpu, b, n * 4));
}

export async function readU32(gpu: Gpu, b: GPUBuffer, n: number): Promise<Uint32Array> {
  return new Uint32Array(await readBuffer(gpu, b, n * 4));
}

/** Runs `encode` in one compute pass and fails on any validation error. */
export async function runPass(
  gpu: Gpu,
  encode: (pass: GPUComputePassEncoder) => void,
): Promise<void> {
  gpu.device.pushErrorScope("validation");
  const enc = gpu.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  encode(pass);
  pass.end();
  gpu.device.queue.submit([enc.finish()]);
  const err = await gpu.device.popErrorScope();
  if (err) throw new Error(`WebGPU validation error: ${err.message}`);
}

export { seededRandom as rng };

/** Uniform values in [-scale, scale). */
export function randomF32(rand: () => number, n: number, scale = 1): Float32Array {
  return Float32Array.from({ length: n }, () => (rand() * 2 - 1) * scale);
}

/**
 * A random tensor [rows, cols] encoded as `type`, with bytes built here independently of the
 * kernels (f16 scales, int8 or nibble quants) so dequantize() is the oracle.
 */
export function randomTensor(
  rand: () => number,
  type: TensorType,
  rows: number,
  cols: number,
  name = "w",
): Tensor {
  const n = rows * cols;
  switch (type) {
    case "f32":
      return { name, type, shape: [rows, cols], data: new Uint8Array(randomF32(rand, n).buffer) };
    case "f16": {
      const h = Uint16Array.from({ length: n }, () => f32ToF16(rand() * 2 - 1));
      return { name, type, shape: [rows, cols], data: new Uint8Array(h.buffer) };
    }
    case "bf16": {
      // The top 16 bits of random f32 values (truncated, as a converter may).
      const bits = new Uint32Array(randomF32(rand, n).buffer);
      const h = Uint16Array.from(bits, (b) => b >>> 16);
      return { name, type, shape: [rows, cols], data: new Uint8Array(h.buffer) };
    }
    default: {
      // Random quant bytes (every bit pattern occurs), then sane f16 scales at the format's
      // scale offsets: positive d (and dmin), signed m for the affine legacy types.
      const { elements, bytes } = BLOCK_LAYOUT[type];
      const data = new Uint8Array((n / elements) * bytes);
      for (let i = 0; i < data.length; i++) data[i] = Math.floor(rand() * 256);
      const view = new DataView(data.buffer);
      const [dAt, mAt, signedMin] = SCALE_OFFSETS[type]!;
      for (let b = 0; b < n / elements; b++) {
        const d = (rand() + 0.1) * (elements === 256 ? 0.01 : 0.05);
        view.setUint16(b * bytes + dAt, f32ToF16(d), true);
        if (mAt !== undefined) {
          const m = signedMin ? (rand() - 0.5) * 0.2 : (rand() + 0.1) * 0.01;
          view.setUint16(b * bytes + mAt, f32ToF16(m), true);
        }
      }
      return { name, type, shape: [rows, cols], data };
    }
  }
}

/** Byte offsets of each block type's f16 scale, its f16 min (if any), and whether the min is signed. */
const SCALE_OFFSETS: Partial<Record<TensorType, [number, number | undefined, boolean]>> = {
  q8_0: [0, undefined, false],
  q4_0: [0, undefined, false],
  q4_1: [0, 2, true],
  q5_0: [0, undefined, false],
  q5_1: [0, 2, true],
  q2_k: [80, 82, false],
  q3_k: [108, undefined, false],
  q4_k: [0, 2, false],
  q5_k: [0, 2, false],
  q6_k: [208, undefined, false],
};

/** max |a - b| / max |b|: the relative error the tests bound. */
export function relativeError(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`length mismatch: ${a.length} vs ${b.length}`);
  let diff = 0;
  let scale = 0;
  for (let i = 0; i < a.length; i++) {
    diff = Math.max(diff, Math.abs(a[i]! - b[i]!));
    scale = Math.max(scale, Math.abs(b[i]!));
  }
  if (Number.isNaN(diff)) return NaN;
  return diff / (scale || 1);
}

/** Packs a step's metadata into a fresh buffer and returns its section bindings. */
export function stepMeta(gpu: Gpu, content: StepContent) {
  const layout = new StepMetaLayout({
    maxRows: Math.max(1, content.rows.length),
    maxSeqs: Math.max(1, content.seqs.length, content.samples.length),
    maxTableEntries: Math.max(1, content.blockTables.length),
  });
  const bytes = new Uint8Array(layout.bytes);
  layout.pack(new DataView(bytes.buffer), content);
  const buffer = uploadBuffer(
    gpu,
    bytes,
    GPUBufferUsage.UNIFORM | GPUBufferUsage.STORAGE,
    "step meta",
  );
  return layout.bindings(buffer);
}

/**
 * Re-encodes an f32 tensor as `type` (round-to-nearest f16; Q8_0/Q4_0 with llama.cpp's
 * reference scales), so tests can build models in every format from one checkpoint.
 */
export function encodeTensor(t: Tensor, type: TensorType): Tensor {
  const x = new Float32Array(
    t.data.buffer.slice(t.data.byteOffset, t.data.byteOffset + t.data.byteLength),
  );
  const n = x.length;
  if (type === "f32") return t;
  if (type === "f16") {
    return { ...t, type, data: new Uint8Array(Uint16Array.from(x, (v) => f32ToF16(v)).buffer) };
  }
  if (type !== "q8_0" && type !== "q4_0") {
    throw new Error(`encodeTensor() makes f32, f16, q8_0 and q4_0 tensors, received ${type}`);
  }
  const blockBytes = type === "q8_0" ? 34 : 18;
  const data = new Uint8Array((n / 32) * blockBytes);
  const view = new DataView(data.buffer);
  for (let b = 0; b < n / 32; b++) {
    const block = x.subarray(b * 32, b * 32 + 32);
    const at = b * blockBytes;
    if (type === "q8_0") {
      const amax = block.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
      const d = amax / 127;
      view.setUint16(at, f32ToF16(d), true);
      block.forEach((v, j) => view.setInt8(at + 2 + j, d ? Math.round(v / d) : 0));
    } else {
      // The value of largest magnitude maps to -8.
      const max = block.reduce((m, v) => (Math.abs(v) > Math.abs(m) ? v : m), 0);
      const d = max / -8;
      view.setUint16(at, f32ToF16(d), true);
      const q = (v: number) => Math.min(15, Math.max(0, Math.round(d ? v / d : 0) + 8));
      for (let j = 0; j < 16; j++) data[at + 2 + j] = q(block[j]!) | (q(block[j + 16]!) << 4);
    }
  }
  return { ...t, type, data };
}
