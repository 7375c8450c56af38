/**
 * Changes to a few logits of one row before it is sampled: what logit_bias, the repetition,
 * presence and frequency penalties and min_tokens come to once the core has counted the
 * sequence's tokens. For each listed token, in this order (llama.cpp's sampler chain and vLLM's
 * sampler agree on it: bias, then the multiplicative penalty, then the subtractive ones):
 *
 *   x = logit + bias;  x = x > 0 ? x / penalty : x * penalty;  logit' = x - subtract
 *
 * Every step is rounded to f32, as the WebGPU kernel computes it, so every engine samples from
 * the same numbers. The list is sparse (only the tokens a rule touches), so what goes to the GPU
 * per step is small whatever the vocabulary.
 */
export interface LogitAdjust {
  /** Distinct token ids. */
  readonly ids: Int32Array;
  readonly bias: Float32Array;
  /** Repetition penalty (1: none). */
  readonly penalty: Float32Array;
  /** Frequency and presence penalties together (0: none). */
  readonly subtract: Float32Array;
}

/**
 * A bias that takes a token out of the draw (min_tokens suppressing EOS): finite, so a kernel
 * never sees an infinity, and so low that exp() of it is exactly 0 at any temperature we accept.
 */
export const SUPPRESS_BIAS = -1e30;

/** One adjusted logit, in f32 steps. */
export function adjustLogit(
  logit: number,
  bias: number,
  penalty: number,
  subtract: number,
): number {
  const x = Math.fround(logit + bias);
  const p = x > 0 ? Math.fround(x / penalty) : Math.fround(x * penalty);
  return Math.fround(p - subtract);
}

/**
 * The row the sampler draws from: a copy of `logits` with `adj` applied, or `logits` itself
 * when there is nothing to apply.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const adj = { ids: new Int32Array([1]), bias: new Float32Array([-100]),
 *   penalty: new Float32Array([1]), subtract: new Float32Array([0]) };
 * assertEquals([...applyLogitAdjust(new Float32Array([0, 3]), adj)], [0, -97]);
 * ```
 */
export function applyLogitAdjust(logits: Float32Array, adj: LogitAdjust | undefined): Float32Array {
  if (adj === undefined || adj.ids.length === 0) return logits;
  const out = logits.slice();
  for (let i = 0; i < adj.ids.length; i++) {
    const id = adj.ids[i]!;
    out[id] = adjustLogit(out[id]!, adj.bias[i]!, adj.penalty[i]!, adj.subtract[i]!);
  }
  return out;
}

/** Why `adj` cannot apply to a row of `vocab` logits, or undefined when it can. */
export function logitAdjustProblem(adj: LogitAdjust, vocab: number): string | undefined {
  const n = adj.ids.length;
  if (adj.bias.length !== n || adj.penalty.length !== n || adj.subtract.length !== n) {
    return `its arrays differ in length (ids ${n}, bias ${adj.bias.length}, penalty ${adj.penalty.length}, subtract ${adj.subtract.length})`;
  }
  const seen = new Set<number>();
  for (let i = 0; i < n; i++) {
    const id = adj.ids[i]!;
    if (!(id >= 0 && id < vocab)) return `token id ${id} is outside 0..${vocab - 1}`;
    if (seen.has(id)) return `token id ${id} is listed twice`;
    seen.add(id);
    if (!(adj.penalty[i]! > 0)) return `the penalty of token ${id} is ${adj.penalty[i]}, not > 0`;
    if (!Number.isFinite(adj.bias[i]!) || !Number.isFinite(adj.subtract[i]!)) {
      return `token ${id} has a bias or subtraction that is not finite`;
    }
  }
  return undefined;
}
