/**
 * Helpers of the CPU engine's kernel tests: random weights of every type, one matmul through a
 * thread pool, and activations as the kernels quantize them.
 */
import {
  BLOCK_LAYOUT,
  BLOCK_SCALE_OFFSETS,
  TENSOR_TYPES,
  type TensorType,
} from "../lib/model/tensor.ts";
import { f32ToF16 } from "../lib/model/dequantize.ts";
import { wasmHeap } from "../kernels/wasm/heap.ts";
import { ActBuffer } from "../kernels/wasm/act_buffer.ts";
import { ThreadPool } from "../kernels/wasm/pool.ts";
import { type KernelFlavour, kernelModule } from "../kernels/wasm/kernel_module.ts";
import { OP, OP_WORDS, ProgramWriter } from "../kernels/wasm/program.ts";
import { rng } from "./_gpu.ts";

/** A random [n, k] tensor of `type`: random quants, scales in ±[0.002, 0.05]. */
export function randomTensor(type: TensorType, n: number, k: number, seed: number): Uint8Array {
  const rand = rng(seed);
  const { elements, bytes } = BLOCK_LAYOUT[type];
  const out = new Uint8Array((n * k / elements) * bytes);
  const view = new DataView(out.buffer);
  if (type === "f32") {
    for (let i = 0; i < n * k; i++) view.setFloat32(4 * i, rand() * 2 - 1, true);
    return out;
  }
  if (type === "f16" || type === "bf16") {
    for (let i = 0; i < n * k; i++) {
      const v = rand() * 2 - 1;
      view.setUint16(
        2 * i,
        type === "f16" ? f32ToF16(v) : new Uint32Array(new Float32Array([v]).buffer)[0]! >>> 16,
        true,
      );
    }
    return out;
  }
  for (let i = 0; i < out.length; i++) out[i] = Math.floor(rand() * 256);
  for (let b = 0; b < out.length / bytes; b++) {
    for (const o of BLOCK_SCALE_OFFSETS[type]) {
      const v = (0.002 + rand() * 0.048) * (rand() < 0.2 ? -1 : 1);
      view.setUint16(b * bytes + o, f32ToF16(v), true);
    }
  }
  return out;
}

/**
 * W·x for `rows` activation rows through the kernels; returns [rows, n] outputs. With `bias`
 * (n values) it is added; with `prior` ([rows, n]) the products are added to it (accumulate).
 */
export async function kernelMatmul(
  pool: ThreadPool,
  type: TensorType,
  w: Uint8Array,
  n: number,
  k: number,
  x: Float32Array,
  rows: number,
  extra: { bias?: Float32Array; prior?: Float32Array } = {},
): Promise<Float32Array> {
  const heap = wasmHeap();
  const wp = heap.alloc(w.length, "test weights");
  heap.u8(wp, w.length).set(w);
  const act = new ActBuffer(heap, rows, k, "test activations");
  heap.f32(act.f, rows * k).set(x);
  const out = heap.alloc(rows * n * 4, "test outputs");
  if (extra.prior) heap.f32(out, rows * n).set(extra.prior);
  const bias = extra.bias ? heap.alloc(n * 4, "test bias") : 0;
  if (extra.bias) heap.f32(bias, n).set(extra.bias);
  const prog = heap.alloc(4 * OP_WORDS * 4, "test program");
  const pw = new ProgramWriter(heap.i32(prog, 4 * OP_WORDS));
  pw.op(OP.quant, [act.desc, rows, k]);
  pw.op(OP.matmul, [
    TENSOR_TYPES.indexOf(type),
    wp,
    n,
    k,
    act.desc,
    rows,
    out,
    n,
    bias,
    extra.prior ? 1 : 0,
  ]);
  pw.end();
  await pool.run(prog);
  const result = heap.f32(out, rows * n).slice();
  heap.free(wp, w.length);
  heap.free(out, rows * n * 4);
  if (bias) heap.free(bias, n * 4);
  heap.free(prog, 4 * OP_WORDS * 4);
  act.free();
  return result;
}

/** Round half to even, as f32x4.nearest does. */
export function nearest(v: number): number {
  const r = Math.round(v);
  return Math.abs(v - Math.trunc(v)) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** x as the kernels quantize it: blocks of `block`, d = amax/127, q = nearest(x·(127/amax)), in f32. */
export function quantized(x: Float32Array, block: number): Float64Array {
  const out = new Float64Array(x.length);
  for (let b = 0; b < x.length; b += block) {
    let amax = 0;
    for (let e = b; e < b + block; e++) amax = Math.max(amax, Math.abs(x[e]!));
    const d = Math.fround(amax / 127);
    const id = amax > 0 ? Math.fround(127 / amax) : 0;
    for (let e = b; e < b + block; e++) out[e] = nearest(Math.fround(x[e]! * id)) * d;
  }
  return out;
}

export async function withPool<T>(
  threads: number,
  flavour: KernelFlavour,
  f: (p: ThreadPool) => Promise<T>,
) {
  const pool = await ThreadPool.start(wasmHeap(), kernelModule(flavour).module, threads);
  try {
    return await f(pool);
  } finally {
    pool.close();
  }
}
