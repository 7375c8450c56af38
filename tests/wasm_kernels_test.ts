/**
 * The CPU engine's matmul kernels against the reference dequantization (lib/model/dequantize.ts,
 * ggml's formulas) with float64 sums, for every tensor type. The kernels multiply activations
 * quantized to 8 bits (per 32 for the 32-element types, per 256 for the K-quants), so each
 * output may differ from the exact sum by at most Σ_blocks (amax_block / 254) · Σ|w| over the
 * block (half a quantization step per element), plus f32 rounding; the float types are held to
 * f32 rounding alone.
 */
import { assert, assertEquals } from "@std/assert";
import {
  BLOCK_LAYOUT,
  BLOCK_SCALE_OFFSETS,
  TENSOR_TYPES,
  type TensorType,
} from "../lib/model/tensor.ts";
import { dequantize, f32ToF16 } from "../lib/model/dequantize.ts";
import { wasmHeap } from "../kernels/wasm/heap.ts";
import { ActBuffer } from "../kernels/wasm/act_buffer.ts";
import { ThreadPool } from "../kernels/wasm/pool.ts";
import {
  type KernelFlavour,
  kernelModule,
  relaxedSimdAvailable,
} from "../kernels/wasm/kernel_module.ts";
import { OP, OP_WORDS, ProgramWriter } from "../kernels/wasm/program.ts";
import { argmax, logSoftmaxAt } from "../lib/engine/sampling.ts";
import { rng } from "./_gpu.ts";

/** A random [n, k] tensor of `type`: random quants, scales in ±[0.002, 0.05]. */
function randomTensor(type: TensorType, n: number, k: number, seed: number): Uint8Array {
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

/** W·x for `rows` activation rows through the kernels; returns [rows, n] outputs. */
async function kernelMatmul(
  pool: ThreadPool,
  type: TensorType,
  w: Uint8Array,
  n: number,
  k: number,
  x: Float32Array,
  rows: number,
): Promise<Float32Array> {
  const heap = wasmHeap();
  const wp = heap.alloc(w.length, "test weights");
  heap.u8(wp, w.length).set(w);
  const act = new ActBuffer(heap, rows, k, "test activations");
  heap.f32(act.f, rows * k).set(x);
  const out = heap.alloc(rows * n * 4, "test outputs");
  const prog = heap.alloc(4 * OP_WORDS * 4, "test program");
  const pw = new ProgramWriter(heap.i32(prog, 4 * OP_WORDS));
  pw.op(OP.quant, [act.desc, rows, k]);
  pw.op(OP.matmul, [TENSOR_TYPES.indexOf(type), wp, n, k, act.desc, rows, out, n, 0, 0]);
  pw.end();
  await pool.run(prog);
  const result = heap.f32(out, rows * n).slice();
  heap.free(wp, w.length);
  heap.free(out, rows * n * 4);
  heap.free(prog, 4 * OP_WORDS * 4);
  act.free();
  return result;
}

// 13 outputs: split over 1, 2 or 3 threads, they reach every path of the kernels (four
// weight rows at a time, and the rows left over).
const N = 13, K = 512, ROWS = 6;

/** Round half to even, as f32x4.nearest does. */
function nearest(v: number): number {
  const r = Math.round(v);
  return Math.abs(v - Math.trunc(v)) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** x as the kernels quantize it: blocks of `block`, d = amax/127, q = nearest(x·(127/amax)), in f32. */
function quantized(x: Float32Array, block: number): Float64Array {
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

async function withPool<T>(
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

Deno.test("the runtime has relaxed SIMD, so the relaxed build is the one that runs", () => {
  assert(relaxedSimdAvailable());
  assertEquals(kernelModule().flavour, "relaxed");
});

for (const type of TENSOR_TYPES) {
  Deno.test(`matmul ${type}: within the 8-bit activation bound of the float64 product of the dequantized weights`, async () => {
    const w = randomTensor(type, N, K, 7 + TENSOR_TYPES.indexOf(type));
    const dense = dequantize({ name: "w", type, shape: [N, K], data: w });
    const rand = rng(99);
    const x = Float32Array.from({ length: ROWS * K }, () => rand() * 4 - 2);
    const got = await withPool(2, "relaxed", (p) => kernelMatmul(p, type, w, N, K, x, ROWS));
    const block = type.endsWith("_k") ? 256 : 32;
    const float = ["f32", "f16", "bf16"].includes(type);
    let worst = 0, typical = 0;
    for (let r = 0; r < ROWS; r++) {
      for (let n = 0; n < N; n++) {
        let exact = 0, abs = 0, bound = 0;
        for (let b = 0; b < K; b += block) {
          let amax = 0, wsum = 0;
          for (let e = b; e < b + block; e++) {
            const wv = dense[n * K + e]!, xv = x[r * K + e]!;
            exact += wv * xv;
            abs += Math.abs(wv * xv);
            amax = Math.max(amax, Math.abs(xv));
            wsum += Math.abs(wv);
          }
          if (!float) bound += (amax / 254) * wsum;
        }
        bound += 1e-5 * abs + 1e-6;
        const err = Math.abs(got[r * N + n]! - exact);
        assert(
          err <= bound,
          `${type} row ${r} out ${n}: |${got[r * N + n]} - ${exact}| = ${err} > ${bound}`,
        );
        worst = Math.max(worst, err / bound);
        typical += Math.abs(exact);
      }
    }
    if (!float) assert(worst > 0, `${type}: no quantization error at all is implausible`);
    assert(typical > 0);
    // Sharper: against the same product with the activations quantized as the kernels do it,
    // only f32 rounding may remain (one misread weight would be off by |w·x| ≈ 0.1).
    const xq = float ? Float64Array.from(x) : quantized(x, block);
    for (let r = 0; r < ROWS; r++) {
      for (let n = 0; n < N; n++) {
        let exact = 0, abs = 0;
        for (let e = 0; e < K; e++) {
          exact += dense[n * K + e]! * xq[r * K + e]!;
          abs += Math.abs(dense[n * K + e]! * xq[r * K + e]!);
        }
        const err = Math.abs(got[r * N + n]! - exact);
        assert(
          err <= 2e-6 * abs + 1e-7,
          `${type} row ${r} out ${n} vs quantized activations: ${got[r * N + n]} vs ${exact}`,
        );
      }
    }
  });

  Deno.test(`matmul ${type}: plain-SIMD and relaxed-SIMD builds, 1 and 3 threads, 1 row or 6 give the same bits`, async () => {
    const w = randomTensor(type, N, K, 31 + TENSOR_TYPES.indexOf(type));
    const rand = rng(5);
    const x = Float32Array.from({ length: ROWS * K }, () => rand() * 2 - 1);
    const relaxed = await withPool(1, "relaxed", (p) => kernelMatmul(p, type, w, N, K, x, ROWS));
    const simd = await withPool(3, "simd", (p) => kernelMatmul(p, type, w, N, K, x, ROWS));
    assertEquals(Array.from(simd), Array.from(relaxed));
    for (const r of [0, 5]) {
      const alone = await withPool(
        3,
        "relaxed",
        (p) => kernelMatmul(p, type, w, N, K, x.subarray(r * K, (r + 1) * K), 1),
      );
      assertEquals(
        Array.from(alone),
        Array.from(relaxed.subarray(r * N, (r + 1) * N)),
        `row ${r} alone`,
      );
    }
  });
}

/** The threads' row statistics (first argmax, max, Σ e^(x − max), fallback flag) of each row. */
async function kernelRowStats(pool: ThreadPool, rows: Float32Array[], V: number) {
  const heap = wasmHeap();
  const lp = heap.alloc(rows.length * V * 4, "test logits");
  rows.forEach((r, i) => heap.f32(lp + i * V * 4, V).set(r));
  const out = heap.alloc(rows.length * 16, "test stats");
  const prog = heap.alloc(2 * OP_WORDS * 4, "test program");
  new ProgramWriter(heap.i32(prog, 2 * OP_WORDS)).op(OP.rowStats, [lp, rows.length, V, out]).end();
  await pool.run(prog);
  const i = heap.i32(out, rows.length * 4).slice(), f = heap.f32(out, rows.length * 4).slice();
  heap.free(lp, rows.length * V * 4);
  heap.free(out, rows.length * 16);
  heap.free(prog, 2 * OP_WORDS * 4);
  return rows.map((_, r) => ({
    at: i[r * 4]!,
    max: f[r * 4 + 1]!,
    sum: f[r * 4 + 2]!,
    bad: i[r * 4 + 3]!,
  }));
}

Deno.test("row statistics: the first argmax and the log-softmax normaliser of argmax() and logSoftmaxAt(), NaN and infinities flagged", async () => {
  const rand = rng(17);
  const V = 1001; // not a multiple of 4
  const rows: Float32Array[] = [];
  for (let r = 0; r < 5; r++) {
    rows.push(Float32Array.from({ length: V }, () => (rand() * 2 - 1) * 12 * (r + 1)));
  }
  rows[1]![700] = 1000; // far above the rest: most terms underflow
  rows[2]![3] = 50, rows[2]![999] = 50; // a tie: the first wins
  rows[3]!.fill(-3); // all equal
  const odd = Float32Array.from({ length: V }, () => rand() * 4);
  odd[1000] = 9; // the largest in the tail past the last 4 lanes
  rows.push(odd);
  const nan = rows[0]!.slice();
  nan[10] = NaN;
  const inf = rows[0]!.slice();
  inf[20] = Infinity;
  rows.push(nan, inf);
  const stats = await withPool(3, "relaxed", (p) => kernelRowStats(p, rows, V));
  for (let r = 0; r < 6; r++) {
    const want = argmax(rows[r]!);
    assertEquals(stats[r]!.at, want, `row ${r} argmax`);
    assertEquals(stats[r]!.max, rows[r]![want], `row ${r} max`);
    assertEquals(stats[r]!.bad, 0);
    const lp = -Math.log(stats[r]!.sum), exact = logSoftmaxAt(rows[r]!, want);
    assert(
      Math.abs(lp - exact) <= 1e-6 * Math.max(1, Math.abs(exact)),
      `row ${r}: logprob ${lp} vs ${exact}`,
    );
  }
  assertEquals(stats[6]!.bad, 1, "a NaN logit");
  assertEquals(stats[7]!.bad, 1, "an infinite logit");
  const simd = await withPool(1, "simd", (p) => kernelRowStats(p, rows, V));
  assertEquals(simd, stats, "plain-SIMD build and 1 thread");
});
