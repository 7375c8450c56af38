/**
 * llama-server's `--embd-normalize` values: -1 none, 0 max absolute value scaled to int16
 * range, 1 taxicab, 2 Euclidean (the default), p > 2 the p-norm.
 */
export const DEFAULT_EMBD_NORMALIZE = 2;

/**
 * Normalizes an embedding as llama.cpp's common_embd_normalize does (float64 sums).
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * assertEquals([...normalizeEmbedding(new Float32Array([3, 4]), 2)], [0.6000000238418579, 0.800000011920929]);
 * ```
 */
export function normalizeEmbedding(v: Float32Array, norm: number): Float32Array {
  let sum = 0;
  if (norm === -1) sum = 1;
  else if (norm === 0) {
    for (const x of v) sum = Math.max(sum, Math.abs(x));
    sum /= 32760;
  } else if (norm === 2) {
    for (const x of v) sum += x * x;
    sum = Math.sqrt(sum);
  } else {
    for (const x of v) sum += Math.abs(x) ** norm;
    sum = sum ** (1 / norm);
  }
  const scale = sum > 0 ? 1 / sum : 0;
  return v.map((x) => x * scale);
}

/** Whether `norm` is one of llama-server's `--embd-normalize` values (an integer from -1). */
export function isEmbdNormalize(norm: number): boolean {
  return Number.isInteger(norm) && norm >= -1;
}
