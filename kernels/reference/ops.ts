/**
 * The CPU reference's vector operations: the twins the GPU kernels are tested against. Inputs
 * and outputs are f32 arrays; sums are accumulated in double precision and each stored result
 * is rounded to f32 once, so the reference is at least as accurate as any f32 kernel.
 */

/**
 * RMS normalisation: out[j] = weight[j] * x[j] / sqrt(mean(x²) + eps). `out` may be `x`.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const out = rmsnorm(new Float32Array(2), new Float32Array([3, 4]), new Float32Array([1, 1]), 0);
 * assertEquals([...out].map((v) => +v.toFixed(4)), [0.8485, 1.1314]); // [3, 4] / sqrt(12.5)
 * ```
 */
export function rmsnorm(
  out: Float32Array,
  x: Float32Array,
  weight: Float32Array,
  eps: number,
): Float32Array {
  if (x.length !== weight.length || out.length !== x.length) {
    throw new Error(
      `Cannot rmsnorm: x, weight and out must have one length, received ${x.length}, ${weight.length} and ${out.length}`,
    );
  }
  let ss = 0;
  for (let j = 0; j < x.length; j++) ss += x[j]! * x[j]!;
  const scale = 1 / Math.sqrt(ss / x.length + eps);
  for (let j = 0; j < x.length; j++) out[j] = weight[j]! * (scale * x[j]!);
  return out;
}

/**
 * out = W·x for a row-major W of shape [out.length, x.length] (the layout of every weight
 * matrix here: [outFeatures, inFeatures]).
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * // W = [[1, 2], [3, 4]], x = [1, 1]
 * const y = matvec(new Float32Array(2), new Float32Array([1, 2, 3, 4]), new Float32Array([1, 1]));
 * assertEquals([...y], [3, 7]);
 * ```
 */
export function matvec(out: Float32Array, w: Float32Array, x: Float32Array): Float32Array {
  const rows = out.length;
  const cols = x.length;
  if (w.length !== rows * cols) {
    throw new Error(
      `Cannot matvec: weight has ${w.length} elements, expected ${rows} x ${cols} = ${rows * cols}`,
    );
  }
  for (let r = 0; r < rows; r++) {
    let sum = 0;
    const base = r * cols;
    for (let c = 0; c < cols; c++) sum += w[base + c]! * x[c]!;
    out[r] = sum;
  }
  return out;
}

/**
 * Rotary position embedding in place, llama2.c's layout: within each head, the adjacent pair
 * (2i, 2i+1) is rotated by the angle pos * theta^(-2i/ropeDim), for 2i < ropeDim; dimensions
 * past ropeDim are left alone.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * // One head of 2 dimensions at position 1: the pair turns by 1 * 10000^0 = 1 radian.
 * const q = rope(new Float32Array([1, 0]), 1, 2, 2, 1, 10000);
 * assertEquals([...q], [Math.fround(Math.cos(1)), Math.fround(Math.sin(1))]);
 * ```
 */
export function rope(
  vec: Float32Array,
  nHeads: number,
  headDim: number,
  ropeDim: number,
  pos: number,
  theta: number,
): Float32Array {
  const freqs = Float64Array.from(
    { length: Math.max(0, Math.floor(ropeDim / 2)) },
    (_, i) => Math.pow(theta, -(2 * i) / ropeDim),
  );
  if (ropeDim % 2 !== 0) {
    throw new Error(`Cannot apply RoPE: ropeDim must be even, received ${ropeDim}`);
  }
  return ropeWithFrequencies(vec, nHeads, headDim, freqs, pos);
}

/**
 * RoPE in place with given per-pair angular frequencies (ropeFrequencies() of a model: the
 * theta powers divided by any Llama 3 factors): pair (2i, 2i+1) of each head turns by
 * pos * freqs[i]; dimensions past 2 * freqs.length are left alone.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { ropeFrequencies } from "../../lib/model/model_config.ts";
 *
 * const freqs = ropeFrequencies({ ropeTheta: 10000, ropeDim: 4 }); // [1, 0.01]
 * // One head of 4 dimensions at position 1: pair (0, 1) turns by 1 radian, pair (2, 3) by 0.01.
 * const q = ropeWithFrequencies(new Float32Array([1, 0, 1, 0]), 1, 4, freqs, 1);
 * assertEquals([...q].map((v) => +v.toFixed(3)), [0.54, 0.841, 1, 0.01]);
 * ```
 */
export function ropeWithFrequencies(
  vec: Float32Array,
  nHeads: number,
  headDim: number,
  freqs: Float64Array,
  pos: number,
): Float32Array {
  const ropeDim = 2 * freqs.length;
  if (vec.length !== nHeads * headDim || ropeDim > headDim) {
    throw new Error(
      `Cannot apply RoPE: vector of ${vec.length} must be ${nHeads} heads x ${headDim}, and ropeDim ${ropeDim} even and <= headDim`,
    );
  }
  for (let i = 0; i < ropeDim; i += 2) {
    const angle = pos * freqs[i / 2]!;
    const cos = Math.cos(angle);
    const sin = Math.sin(angle);
    for (let h = 0; h < nHeads; h++) {
      const j = h * headDim + i;
      const v0 = vec[j]!;
      const v1 = vec[j + 1]!;
      vec[j] = v0 * cos - v1 * sin;
      vec[j + 1] = v0 * sin + v1 * cos;
    }
  }
  return vec;
}

/**
 * RMSNorm of each head of `vec` (nHeads runs of weight.length values) in place, every head with
 * the same weights: Qwen3's q/k norms.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * // Two heads of 2: each normalised on its own, so [6, 8] ends like [3, 4].
 * const q = headRmsnorm(new Float32Array([3, 4, 6, 8]), 2, new Float32Array([1, 1]), 0);
 * assertEquals([...q].map((v) => +v.toFixed(4)), [0.8485, 1.1314, 0.8485, 1.1314]);
 * ```
 */
export function headRmsnorm(
  vec: Float32Array,
  nHeads: number,
  weight: Float32Array,
  eps: number,
): Float32Array {
  const hd = weight.length;
  if (vec.length !== nHeads * hd) {
    throw new Error(
      `Cannot normalise heads: vector of ${vec.length} must be ${nHeads} heads x ${hd} (the norm weights' length)`,
    );
  }
  for (let h = 0; h < nHeads; h++) {
    const head = vec.subarray(h * hd, (h + 1) * hd);
    rmsnorm(head, head, weight, eps);
  }
  return vec;
}

/** SiLU (swish): x * sigmoid(x). */
export function silu(x: number): number {
  return x / (1 + Math.exp(-x));
}

/**
 * SwiGLU in place on `gate`: gate[i] = silu(gate[i]) * up[i].
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const out = swiglu(new Float32Array([0, 1]), new Float32Array([5, 2]));
 * assertEquals([...out].map((v) => +v.toFixed(4)), [0, 1.4621]); // silu(0) * 5, silu(1) * 2
 * ```
 */
export function swiglu(gate: Float32Array, up: Float32Array): Float32Array {
  if (gate.length !== up.length) {
    throw new Error(`Cannot apply SwiGLU: gate has ${gate.length} elements, up has ${up.length}`);
  }
  for (let i = 0; i < gate.length; i++) gate[i] = silu(gate[i]!) * up[i]!;
  return gate;
}

/** Softmax in place over x[0..n) (all of x by default), max-subtracted for stability. */
export function softmax(x: Float32Array, n: number = x.length): Float32Array {
  let max = -Infinity;
  for (let i = 0; i < n; i++) max = Math.max(max, x[i]!);
  let sum = 0;
  const e = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    e[i] = Math.exp(x[i]! - max);
    sum += e[i]!;
  }
  for (let i = 0; i < n; i++) x[i] = e[i]! / sum;
  return x;
}

/** Residual add in place: x[i] += y[i]. */
export function addInPlace(x: Float32Array, y: Float32Array): Float32Array {
  if (x.length !== y.length) {
    throw new Error(`Cannot add: lengths differ, received ${x.length} and ${y.length}`);
  }
  for (let i = 0; i < x.length; i++) x[i] = x[i]! + y[i]!;
  return x;
}
