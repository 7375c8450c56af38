import type { ForwardSteps } from "./architecture.ts";

/** Hyper-parameters of a Llama-family model, whatever file it came from. */
export interface ModelConfig {
  /** `general.architecture` (llama2.c checkpoints are "llama"). */
  readonly architecture: string;
  /** Embedding width. */
  readonly dim: number;
  /** Feed-forward (SwiGLU) inner width. */
  readonly hiddenDim: number;
  readonly nLayers: number;
  readonly nHeads: number;
  /** Key/value heads; fewer than nHeads means grouped-query attention. */
  readonly nKvHeads: number;
  /** Size of one attention head; q is nHeads × headDim wide, which need not equal dim (Qwen3). */
  readonly headDim: number;
  readonly vocabSize: number;
  /** Longest sequence (prompt + completion) the model accepts. */
  readonly contextLength: number;
  readonly ropeTheta: number;
  /** Leading dimensions of each head that RoPE rotates (usually headDim). */
  readonly ropeDim: number;
  /**
   * Divisors of each RoPE pair's frequency (ropeDim / 2 of them), from `rope_freqs.weight`:
   * Llama 3.1's long-context scaling. Absent: every divisor is 1.
   */
  readonly ropeFreqFactors?: Float32Array;
  readonly rmsEps: number;
  /** Optional forward steps (q/k/v biases, q/k norms); absent: none, plain Llama. */
  readonly steps?: ForwardSteps;
}

/** What a file leaves out takes Llama's values (llama.cpp's defaults, llama2.c's only ones). */
export const LLAMA_DEFAULTS = { ropeTheta: 10000, rmsEps: 1e-5 } as const;

/**
 * Angular frequency of each RoPE pair i < ropeDim/2: theta^(-2i/ropeDim) / factor[i], in double
 * precision. Both engines rotate pair i of a head at position pos by pos × this.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * assertEquals([...ropeFrequencies({ ropeTheta: 10000, ropeDim: 4 })], [1, 0.01]);
 * ```
 */
export function ropeFrequencies(
  config: Pick<ModelConfig, "ropeTheta" | "ropeDim" | "ropeFreqFactors">,
): Float64Array {
  const pairs = config.ropeDim / 2;
  const out = new Float64Array(pairs);
  for (let i = 0; i < pairs; i++) {
    out[i] = Math.pow(config.ropeTheta, -(2 * i) / config.ropeDim) /
      (config.ropeFreqFactors?.[i] ?? 1);
  }
  return out;
}
