import type { SamplingParams } from "./engine.ts";
import {
  argmax,
  checkParams,
  isGreedyTemperature,
  logSoftmaxAt,
  minPCount,
  sample,
  type SampleResult,
  topPCount,
} from "./sampling.ts";
import { uniform } from "../util/rng.ts";

/**
 * Tokens more than this many nats below the best are left out of the sort: together they hold
 * at most vocab × e^-24 (3e-6 at 150k) of the probability. When the draw lands in that tail,
 * the row is drawn again by sample() itself, so the result is the same either way.
 */
const TAIL_NATS = 24;

/** Whether `p` samples a row as its argmax (greedy temperature, or top-k of 1). */
export function samplesArgmax(p: SamplingParams): boolean {
  return isGreedyTemperature(p.temperature) || p.topK === 1;
}

/**
 * sample() (sampling.ts) without sorting the vocabulary: greedy is one pass, top-k keeps a
 * k-element selection, and otherwise only the tokens within TAIL_NATS of the best are sorted.
 * The candidates, their order and the draw u = uniform(seed, position) are sample()'s; only
 * the normalising sum is taken in index order rather than sorted order.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { sample } from "./sampling.ts";
 *
 * const logits = new Float32Array([0.5, 2, 1.5, -1, 0, 1.9]);
 * const p = { temperature: 0.8, topK: 40, topP: 0.95, minP: 0, seed: 1 };
 * assertEquals(sampleRow(logits, p, 7).token, sample(logits, p, 7).token);
 * ```
 */
export function sampleRow(logits: Float32Array, p: SamplingParams, position: number): SampleResult {
  checkParams(p, logits.length);
  if (samplesArgmax(p)) {
    const token = argmax(logits);
    return { token, logprob: logSoftmaxAt(logits, token) };
  }
  const n = logits.length;
  const scaled = new Float32Array(n);
  let max = -Infinity;
  for (let i = 0; i < n; i++) {
    const s = Math.fround(logits[i]! / p.temperature);
    scaled[i] = s;
    if (s > max) max = s;
  }
  const byTopK = p.topK > 0 && p.topK < n;
  let ids: number[];
  if (byTopK) {
    ids = topK(scaled, p.topK);
  } else {
    ids = [];
    const floor = max - TAIL_NATS;
    for (let i = 0; i < n; i++) if (scaled[i]! >= floor) ids.push(i);
  }
  ids.sort((a, b) => scaled[b]! - scaled[a]! || a - b);
  // The candidates are a prefix of the full order that leaves a tail out; the sum still
  // covers the tail, as sample()'s does.
  const tailCut = !byTopK && ids.length < n;
  let total = 0;
  if (tailCut) { for (let i = 0; i < n; i++) total += Math.exp(scaled[i]! - max); }
  else for (const id of ids) total += Math.exp(scaled[id]! - max);
  let probs = ids.map((id) => Math.exp(scaled[id]! - max) / total);
  if (p.topP < 1) {
    const keep = topPCount(probs, p.topP);
    if (keep < 0 && tailCut) return sample(logits, p, position);
    if (keep > 0) {
      ids = ids.slice(0, keep);
      probs = probs.slice(0, keep);
    }
  }
  if (p.minP > 0) {
    const keep = minPCount(probs, p.minP);
    if (keep === probs.length && tailCut && p.topP >= 1) {
      // Tokens past the tail might still clear the min-p floor.
      if (Math.exp(-TAIL_NATS) >= p.minP) return sample(logits, p, position);
    }
    ids = ids.slice(0, keep);
    probs = probs.slice(0, keep);
  }
  const kept = probs.reduce((a, b) => a + b, 0);
  const target = uniform(p.seed, position) * kept;
  let cum = 0;
  for (let j = 0; j < ids.length; j++) {
    cum += probs[j]!;
    if (cum > target) return { token: ids[j]!, logprob: logSoftmaxAt(logits, ids[j]!) };
  }
  // The draw fell past the sorted candidates: only the full order can say where.
  if (tailCut && p.topP >= 1 && p.minP === 0) return sample(logits, p, position);
  const token = ids[ids.length - 1]!;
  return { token, logprob: logSoftmaxAt(logits, token) };
}

/** The k largest (ties: lower index) by a min-heap over the vocabulary. */
function topK(v: Float32Array, k: number): number[] {
  const heap: number[] = [];
  const less = (a: number, b: number) => v[a]! < v[b]! || (v[a] === v[b] && a > b);
  const down = (i: number) => {
    for (;;) {
      const l = 2 * i + 1, r = l + 1;
      let m = i;
      if (l < heap.length && less(heap[l]!, heap[m]!)) m = l;
      if (r < heap.length && less(heap[r]!, heap[m]!)) m = r;
      if (m === i) return;
      [heap[i], heap[m]] = [heap[m]!, heap[i]!];
      i = m;
    }
  };
  for (let i = 0; i < v.length; i++) {
    if (heap.length < k) {
      heap.push(i);
      for (let j = heap.length - 1; j > 0;) {
        const parent = (j - 1) >> 1;
        if (!less(heap[j]!, heap[parent]!)) break;
        [heap[j], heap[parent]] = [heap[parent]!, heap[j]!];
        j = parent;
      }
    } else if (less(heap[0]!, i)) {
      heap[0] = i;
      down(0);
    }
  }
  return heap;
}
