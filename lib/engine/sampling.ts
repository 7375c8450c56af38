import type { SamplingParams } from "./engine.ts";
import { uniform } from "../util/rng.ts";

/** The tokens a sampler may draw, most likely first, with their renormalised probabilities. */
export interface CandidateSet {
  readonly ids: number[];
  readonly probs: number[];
}

/** A drawn token and its log-probability under the raw logits (temperature 1). */
export interface SampleResult {
  readonly token: number;
  readonly logprob: number;
}

/**
 * Index of the largest logit; the lowest index wins ties, so every backend picks the same token.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * assertEquals(argmax(new Float32Array([1, 3, 3])), 1);
 * ```
 */
export function argmax(logits: ArrayLike<number>): number {
  if (logits.length === 0) throw new Error("Cannot take argmax: logits are empty");
  let best = 0;
  let bestValue = logits[0]!;
  for (let i = 1; i < logits.length; i++) {
    const v = logits[i]!;
    if (v > bestValue) {
      best = i;
      bestValue = v;
    }
  }
  return best;
}

/**
 * log(softmax(logits)[i]), computed stably in double precision.
 *
 * ```ts
 * import { assertAlmostEquals } from "@std/assert";
 *
 * assertAlmostEquals(logSoftmaxAt([0, 0], 1), -Math.LN2); // log(1/2)
 * ```
 */
export function logSoftmaxAt(logits: ArrayLike<number>, i: number): number {
  if (!(i >= 0 && i < logits.length)) {
    throw new Error(`Cannot take log-softmax: index ${i} is outside 0..${logits.length - 1}`);
  }
  let max = -Infinity;
  for (let j = 0; j < logits.length; j++) max = Math.max(max, logits[j]!);
  let sum = 0;
  for (let j = 0; j < logits.length; j++) sum += Math.exp(logits[j]! - max);
  return logits[i]! - max - Math.log(sum);
}

/**
 * Temperatures below this sample as greedy (vLLM's _SAMPLING_EPS). Dividing logits by a tiny
 * temperature overflows f32 to infinity (1e-38) or divides by a double that f32 cannot hold
 * (1e-320), and the "sample" then picks by rounding noise: often the least likely token. Above
 * it, |logit| / T stays far inside f32 for any logit a model produces.
 */
export const MIN_TEMPERATURE = 1e-5;

/** True when `temperature` means argmax (0, negative, or below MIN_TEMPERATURE). */
export function isGreedyTemperature(temperature: number): boolean {
  return !(temperature >= MIN_TEMPERATURE);
}

/** Throws naming the first invalid sampling parameter (shared by every sampler). */
export function checkParams(p: SamplingParams, vocab: number): void {
  const bad = (what: string, got: unknown) => {
    throw new Error(`Cannot sample: ${what}, received ${got}`);
  };
  if (Number.isNaN(p.temperature)) bad("temperature must be a number", p.temperature);
  if (!(Number.isInteger(p.topK) && p.topK >= 0)) {
    bad("topK must be a non-negative integer", p.topK);
  }
  if (!(p.topP >= 0 && p.topP <= 1)) bad("topP must be within [0, 1]", p.topP);
  if (!(p.minP >= 0 && p.minP <= 1)) bad("minP must be within [0, 1]", p.minP);
  if (vocab === 0) bad("logits must not be empty", "0 logits");
}

/**
 * How many of `probs` (descending) top-p keeps: the smallest prefix whose sum reaches topP, so
 * at least one; -1 where rounding leaves the whole sum short of topP.
 */
export function topPCount(probs: readonly number[], topP: number): number {
  let cum = 0;
  for (let j = 0; j < probs.length; j++) {
    cum += probs[j]!;
    if (cum >= topP) return j + 1;
  }
  return -1;
}

/** How many of `probs` (descending) clear min-p's floor, minP times the largest: at least one. */
export function minPCount(probs: readonly number[], minP: number): number {
  const floor = minP * probs[0]!;
  let keep = 0;
  while (keep < probs.length && probs[keep]! >= floor) keep++;
  return keep;
}

/**
 * The set a sampler draws from after temperature, top-k, top-p and min-p, in descending
 * probability order (ties: lower index first), probabilities renormalised to sum to 1.
 * A temperature below MIN_TEMPERATURE (or <= 0) keeps only the argmax. Arithmetic after the temperature division (done in
 * f32, as a kernel does it) is in double precision.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * // top-k 2 keeps the two largest logits, most likely first.
 * const { ids } = candidateSet([2, 1, 0], { temperature: 1, topK: 2, topP: 1, minP: 0, seed: 0 });
 * assertEquals(ids, [0, 1]);
 * ```
 */
export function candidateSet(logits: ArrayLike<number>, params: SamplingParams): CandidateSet {
  checkParams(params, logits.length);
  if (isGreedyTemperature(params.temperature)) return { ids: [argmax(logits)], probs: [1] };

  const scaled = new Float64Array(logits.length);
  for (let i = 0; i < logits.length; i++) scaled[i] = Math.fround(logits[i]! / params.temperature);
  const order = Array.from({ length: logits.length }, (_, i) => i);
  order.sort((a, b) => scaled[b]! - scaled[a]! || a - b);

  let ids = params.topK > 0 ? order.slice(0, params.topK) : order;
  const max = scaled[ids[0]!]!;
  const weights = ids.map((id) => Math.exp(scaled[id]! - max));
  const total = weights.reduce((a, b) => a + b, 0);
  let probs = weights.map((w) => w / total);

  if (params.topP < 1) {
    // Rounding may leave the sum short of topP: then every token stays.
    const keep = topPCount(probs, params.topP);
    if (keep > 0) {
      ids = ids.slice(0, keep);
      probs = probs.slice(0, keep);
    }
  }

  if (params.minP > 0) {
    const keep = minPCount(probs, params.minP);
    ids = ids.slice(0, keep);
    probs = probs.slice(0, keep);
  }

  const kept = probs.reduce((a, b) => a + b, 0);
  return { ids, probs: probs.map((p) => p / kept) };
}

/**
 * Draws the next token. The draw is u = uniform(seed, position), where position is the position
 * the sampled token will occupy, so re-running or re-batching a sequence draws the same token.
 * Walks the candidate set accumulating probability and picks the first token whose cumulative
 * probability exceeds u times the total (the last one if rounding leaves none).
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { GREEDY } from "./engine.ts";
 *
 * const logits = new Float32Array([0.1, 2.5, -1]);
 * assertEquals(sample(logits, GREEDY, 5).token, argmax(logits)); // greedy: the argmax, 1
 * // Sampled: the same seed and position draw the same token, however often it is re-run.
 * const warm = { temperature: 1, topK: 0, topP: 1, minP: 0, seed: 42 };
 * assertEquals(sample(logits, warm, 5).token, sample(logits, warm, 5).token);
 * ```
 */
export function sample(
  logits: ArrayLike<number>,
  params: SamplingParams,
  position: number,
): SampleResult {
  const { ids, probs } = candidateSet(logits, params);
  let token = ids[ids.length - 1]!;
  if (ids.length > 1) {
    const total = probs.reduce((a, b) => a + b, 0);
    const target = uniform(params.seed, position) * total;
    let cum = 0;
    for (let j = 0; j < ids.length; j++) {
      cum += probs[j]!;
      if (cum > target) {
        token = ids[j]!;
        break;
      }
    }
  }
  return { token, logprob: logSoftmaxAt(logits, token) };
}
