/** The most likely tokens of one row, most likely first, with their logprobs. */
export interface TopLogprobs {
  readonly ids: readonly number[];
  readonly logprobs: readonly number[];
}

/** The most alternatives a row may ask for (OpenAI's limit for top_logprobs and logprobs). */
export const MAX_TOP_LOGPROBS = 20;

/**
 * The `n` largest logits of a row (ties: the lower id first) with their log softmax at
 * temperature 1, in double precision. One pass per pick over the row: n is at most 20.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * assertEquals(topLogprobs(new Float32Array([0, 2, 1]), 2).ids, [1, 2]); // the two likeliest
 * ```
 */
export function topLogprobs(logits: Float32Array, n: number): TopLogprobs {
  if (!(Number.isInteger(n) && n >= 0 && n <= MAX_TOP_LOGPROBS)) {
    throw new Error(
      `Cannot list top logprobs: n must be an integer in 0..${MAX_TOP_LOGPROBS}, received ${n}`,
    );
  }
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) max = Math.max(max, logits[i]!);
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i]! - max);
  const lse = max + Math.log(sum);
  const ids: number[] = [];
  const logprobs: number[] = [];
  let prevV = Infinity, prevI = -1;
  for (let k = 0; k < Math.min(n, logits.length); k++) {
    let best = -1, bestV = -Infinity;
    for (let i = 0; i < logits.length; i++) {
      const v = logits[i]!;
      // Strictly after the previous pick in (value descending, id ascending) order.
      if (v > prevV || (v === prevV && i <= prevI)) continue;
      if (best < 0 || v > bestV) {
        best = i;
        bestV = v;
      }
    }
    if (best < 0) break;
    ids.push(best);
    logprobs.push(bestV - lse);
    prevV = bestV;
    prevI = best;
  }
  return { ids, logprobs };
}
