/**
 * The prefill GEMM (kernels/wasm/as/gemm.ts and gemm_blocks.ts), which takes the matmuls of 8
 * rows and more for the K-quants and the 32-element 4/5-bit types: against the reference
 * dequantization with float64 sums, and bit for bit against each row computed alone (the 1-row
 * decode path), on 1 and 2 threads and in both builds (Q4_K and Q5_K from 64 rows). The
 * shapes reach its ragged edges: weight tiles of 4 rows and the 1 to 3 left over on each
 * thread, activation tiles of 4 rows and the 1 to 3 left over, 1 and 5 super-blocks (3 and 40
 * blocks of 32), and a width of 16384 whose K-quant rows take 3 to a tile.
 */
import { assert, assertEquals } from "@std/assert";
import type { TensorType } from "../lib/model/tensor.ts";
import { dequantize } from "../lib/model/dequantize.ts";
import { rng } from "./_gpu.ts";
import { kernelMatmul, quantized, randomTensor, withPool } from "./_wasm_kernels.ts";

const TYPES: TensorType[] = [
  "q2_k",
  "q3_k",
  "q4_k",
  "q5_k",
  "q6_k",
  "q4_0",
  "q4_1",
  "q5_0",
  "q5_1",
];
const N = 13;
const SHAPES: [k: number, rows: number][] = [[256, 8], [1280, 11], [256, 40], [1280, 23], [
  16384,
  9,
]];
/**
 * Q4_K and Q5_K take the GEMM from 64 rows (GEMM_MIN_ROWS_Q45K); the 32-element types are
 * also tried at a width that is no multiple of 256, as Qwen2.5-0.5B's 896.
 */
const shapes = (type: TensorType): [number, number][] =>
  type === "q4_k" || type === "q5_k"
    ? [[256, 64], [1280, 67], [16384, 65]]
    : type.endsWith("_k")
    ? SHAPES
    : [...SHAPES, [96, 13]];
/** Activations are quantized in blocks of the weight type's. */
const actBlock = (type: TensorType) => type.endsWith("_k") ? 256 : 32;

function activations(rows: number, k: number, seed: number): Float32Array {
  const rand = rng(seed);
  return Float32Array.from({ length: rows * k }, () => rand() * 4 - 2);
}

for (const type of TYPES) {
  Deno.test(`gemm ${type}: every output within f32 rounding of the float64 product of the dequantized weights and the 8-bit activations`, async () => {
    for (const [k, rows] of shapes(type)) {
      const w = randomTensor(type, N, k, 3 + k + rows);
      const dense = dequantize({ name: "w", type, shape: [N, k], data: w });
      const x = activations(rows, k, 11 + rows);
      const got = await withPool(2, "relaxed", (p) => kernelMatmul(p, type, w, N, k, x, rows));
      const xq = quantized(x, actBlock(type));
      for (let r = 0; r < rows; r++) {
        for (let n = 0; n < N; n++) {
          let exact = 0, abs = 0;
          for (let e = 0; e < k; e++) {
            exact += dense[n * k + e]! * xq[r * k + e]!;
            abs += Math.abs(dense[n * k + e]! * xq[r * k + e]!);
          }
          assert(abs > 0);
          const err = Math.abs(got[r * N + n]! - exact);
          assert(
            err <= 2e-6 * abs + 1e-7,
            `${type} K ${k}, row ${r} of ${rows}, out ${n}: ${got[r * N + n]} vs ${exact}`,
          );
        }
      }
    }
  });

  Deno.test(`gemm ${type}: a row batched with 7 to 66 others has the bits it has alone, on 1 or 2 threads, plain or relaxed build`, async () => {
    for (const [k, rows] of shapes(type)) {
      const w = randomTensor(type, N, k, 41 + k + rows);
      const x = activations(rows, k, 5 + rows);
      const batched = await withPool(2, "relaxed", (p) => kernelMatmul(p, type, w, N, k, x, rows));
      const oneThread = await withPool(1, "simd", (p) => kernelMatmul(p, type, w, N, k, x, rows));
      assertEquals(
        Array.from(oneThread),
        Array.from(batched),
        `${type} K ${k} × ${rows} rows: 1 thread plain vs 2 threads relaxed`,
      );
      await withPool(1, "relaxed", async (p) => {
        for (const r of new Set([0, 5, rows - 1])) {
          const alone = await kernelMatmul(p, type, w, N, k, x.subarray(r * k, (r + 1) * k), 1);
          assertEquals(
            Array.from(alone),
            Array.from(batched.subarray(r * N, (r + 1) * N)),
            `${type} K ${k}: row ${r} of ${rows} alone`,
          );
        }
      });
    }
  });
}

Deno.test("gemm: the bias is added and an accumulating matmul adds to what the output held, as the 1-row path does", async () => {
  const k = 512, rows = 9;
  const rand = rng(77);
  const bias = Float32Array.from({ length: N }, () => rand() - 0.5);
  const prior = Float32Array.from({ length: rows * N }, () => rand() * 8 - 4);
  for (const type of ["q3_k", "q6_k", "q5_0", "q4_1"] as TensorType[]) {
    const w = randomTensor(type, N, k, 9);
    const x = activations(rows, k, 21);
    const plain = await withPool(2, "relaxed", (p) => kernelMatmul(p, type, w, N, k, x, rows));
    const got = await withPool(
      2,
      "relaxed",
      (p) => kernelMatmul(p, type, w, N, k, x, rows, { bias, prior }),
    );
    for (let i = 0; i < rows * N; i++) {
      assertEquals(
        got[i],
        Math.fround(prior[i]! + Math.fround(plain[i]! + bias[i % N]!)),
        `${type} output ${i}`,
      );
    }
    const last = await withPool(
      1,
      "relaxed",
      (p) =>
        kernelMatmul(p, type, w, N, k, x.subarray((rows - 1) * k), 1, {
          bias,
          prior: prior.subarray((rows - 1) * N),
        }),
    );
    assertEquals(Array.from(last), Array.from(got.subarray((rows - 1) * N)));
  }
});
