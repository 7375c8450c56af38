/**
 * The CPU engine's matmul kernels against the reference dequantization (lib/model/dequantize.ts,
 * ggml's formulas) with float64 sums, for every tensor type. The kernels multiply activations
 * quantized to 8 bits (per 32 for the 32-element types, per 256 for the K-quants), so each
 * output may differ from the exact sum by at most Σ_blocks (amax_block / 254) · Σ|w| over the
 * block (half a quantization step per element), plus f32 rounding; the float types are held to
 * f32 rounding alone.
 */
import { assert, assertEquals } from "@std/assert";
import { BLOCK_LAYOUT, BLOCK_SCALE_OFFSETS, TENSOR_TYPES } from "../lib/model/tensor.ts";
import { dequantize } from "../lib/model/dequantize.ts";
import { wasmHeap } from "../kernels/wasm/heap.ts";
import { ThreadPool } from "../kernels/wasm/pool.ts";
import { kernelModule, relaxedSimdAvailable } from "../kernels/wasm/kernel_module.ts";
import { OP, OP_WORDS, ProgramWriter } from "../kernels/wasm/program.ts";
import { argmax, logSoftmaxAt } from "../lib/engine/sampling.ts";
import { rng } from "./_gpu.ts";
import { kernelMatmul, quantized, randomTensor, withPool } from "./_wasm_kernels.ts";

// 13 outputs: split over 1, 2 or 3 threads, they reach every path of the kernels (four
// weight rows at a time, and the rows left over).
const N = 13, K = 512, ROWS = 6;

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

// Block scales a file may hold beside the usual normal halves: zero, ±0, the smallest and
// largest subnormals, and negative ones. The decode kernels convert four rows' scales at once
// and the K-quants a super-block's d and dmin together, and take a slower exact path when any
// of them is zero or subnormal.
const ODD_SCALES = [0x0000, 0x8000, 0x0001, 0x03ff, 0x8200, 0x0400, 0x8401];

for (
  const type of ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q4_k", "q5_k", "q6_k"] as const
) {
  Deno.test(`matmul ${type}: zero and subnormal block scales in some of four rows give the float64 product, alone or batched`, async () => {
    const w = randomTensor(type, N, K, 77 + TENSOR_TYPES.indexOf(type));
    const { bytes, elements } = BLOCK_LAYOUT[type];
    const view = new DataView(w.buffer);
    const nb = K / elements;
    // Every third block of every row gets odd scales (and minimums where the type has them),
    // so four-row groups mix them with normal ones in every combination the pattern reaches.
    let k = 0;
    for (let n = 0; n < N; n++) {
      for (let j = n % 3; j < nb; j += 3) {
        for (const o of BLOCK_SCALE_OFFSETS[type]) {
          view.setUint16((n * nb + j) * bytes + o, ODD_SCALES[k++ % ODD_SCALES.length]!, true);
        }
      }
    }
    const dense = dequantize({ name: "w", type, shape: [N, K], data: w });
    const rand = rng(3);
    const x = Float32Array.from({ length: ROWS * K }, () => rand() * 2 - 1);
    const xq = quantized(x, elements);
    const got = await withPool(2, "relaxed", (p) => kernelMatmul(p, type, w, N, K, x, ROWS));
    for (let r = 0; r < ROWS; r++) {
      const alone = await withPool(
        1,
        "relaxed",
        (p) => kernelMatmul(p, type, w, N, K, x.subarray(r * K, (r + 1) * K), 1),
      );
      assertEquals(
        Array.from(alone),
        Array.from(got.subarray(r * N, (r + 1) * N)),
        `row ${r} alone`,
      );
      for (let n = 0; n < N; n++) {
        let exact = 0, abs = 0;
        for (let e = 0; e < K; e++) {
          exact += dense[n * K + e]! * xq[r * K + e]!;
          abs += Math.abs(dense[n * K + e]! * xq[r * K + e]!);
        }
        const err = Math.abs(got[r * N + n]! - exact);
        assert(
          err <= 2e-6 * abs + 1e-12,
          `${type} row ${r} out ${n}: ${got[r * N + n]} vs ${exact}`,
        );
      }
    }
  });
}

// Steps of 2, 3, 7 and 9 rows: Q4_K and Q5_K take tiles of eight rows (below gemm()'s 64), the
// rows past the tiles of four go in pairs where a type shares a weight block's unpacking
// between two rows, then one at a time.
for (const type of ["q4_0", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"] as const) {
  Deno.test(`matmul ${type}: steps of 2, 3, 7 and 9 rows give every row the bits it gets alone, on 1 and 2 threads`, async () => {
    const w = randomTensor(type, N, K, 51 + TENSOR_TYPES.indexOf(type));
    const rand = rng(17);
    const x = Float32Array.from({ length: 9 * K }, () => rand() * 2 - 1);
    const alone = await withPool(1, "relaxed", async (p) => {
      const rows: number[][] = [];
      for (let r = 0; r < 9; r++) {
        rows.push(
          Array.from(await kernelMatmul(p, type, w, N, K, x.subarray(r * K, (r + 1) * K), 1)),
        );
      }
      return rows;
    });
    for (const threads of [1, 2]) {
      for (const rows of [2, 3, 7, 9]) {
        const got = await withPool(
          threads,
          "relaxed",
          (p) => kernelMatmul(p, type, w, N, K, x.subarray(0, rows * K), rows),
        );
        for (let r = 0; r < rows; r++) {
          assertEquals(
            Array.from(got.subarray(r * N, (r + 1) * N)),
            alone[r],
            `${rows} rows, ${threads} threads, row ${r}`,
          );
        }
      }
    }
    const simd = await withPool(2, "simd", (p) => kernelMatmul(p, type, w, N, K, x, 9));
    assertEquals(Array.from(simd), alone.flat(), "the plain-SIMD build, 9 rows");
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
