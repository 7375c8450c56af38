/**
 * Residual-stream rows after the model's final RMS norm, as llama.cpp pools them into
 * embeddings (SeqInput.hidden): each row scaled by 1 / sqrt(mean square + eps), in float64 sums,
 * times the output norm's weights. The engines that read their residual rows back to the host
 * (cpu, webgpu) apply it there, so their hidden states differ only where the rows do.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const rows = finalNormRows(new Float32Array([3, 4, 0, 2]), new Float32Array([1, 2]), 0);
 * assertEquals([...rows].map((v) => +v.toFixed(4)), [0.8485, 2.2627, 0, 2.8284]);
 * ```
 */
export function finalNormRows(x: Float32Array, weight: Float32Array, eps: number): Float32Array {
  const dim = weight.length;
  if (x.length % dim !== 0) {
    throw new Error(
      `Cannot normalize hidden rows: ${x.length} values are not whole rows of ${dim}`,
    );
  }
  const out = new Float32Array(x.length);
  for (let at = 0; at < x.length; at += dim) {
    let ss = 0;
    for (let j = 0; j < dim; j++) ss += x[at + j]! * x[at + j]!;
    const scale = 1 / Math.sqrt(ss / dim + eps);
    for (let j = 0; j < dim; j++) out[at + j] = x[at + j]! * scale * weight[j]!;
  }
  return out;
}
