import { SimilarIndex } from "./similar_index.ts";

/** What a stored similar question points at: the exact cache's key of its answer. */
interface SimilarEntry {
  readonly key: string;
  readonly question: string;
}

/** The cache for similar questions' counts, for /metrics. */
export interface SimilarCacheStats {
  readonly threshold: number;
  readonly hits: number;
  readonly misses: number;
  /** Misses whose best score fell within 0.1 below the threshold, by 0.05-wide band ("0.85"). */
  readonly nearMisses: Readonly<Record<string, number>>;
  readonly entries: number;
  readonly bytes: number;
}

/** Characters of the cached question a hit names (`matched`). */
export const MATCHED_CHARS = 80;

/**
 * The cache for similar questions: a question's embedding, in its context, points at the exact
 * result cache's entry of its answer. A lookup at or above `threshold` (cosine similarity) is a
 * hit; the caller replays that entry if the exact cache still holds it.
 */
export class SimilarCache {
  readonly #index: SimilarIndex<SimilarEntry>;
  #hits = 0;
  #misses = 0;
  readonly #near: Record<string, number> = {};

  constructor(readonly threshold: number, dim: number, capacityBytes: number) {
    this.#index = new SimilarIndex(
      dim,
      capacityBytes,
      (e) => 2 * (e.key.length + e.question.length),
    );
  }

  /** The exact-cache key of the closest question's answer at or above the threshold. */
  lookup(
    context: string,
    v: Float32Array,
  ): { key: string; score: number; matched: string } | undefined {
    const m = this.#index.nearest(context, v);
    if (m && m.score >= this.threshold) {
      this.#hits++;
      return {
        key: m.payload.key,
        score: m.score,
        matched: m.payload.question.slice(0, MATCHED_CHARS),
      };
    }
    this.#misses++;
    if (m && m.score >= this.threshold - 0.1) {
      const band = (Math.floor(m.score * 20) / 20).toFixed(2);
      this.#near[band] = (this.#near[band] ?? 0) + 1;
    }
    return undefined;
  }

  /** A hit whose answer the exact cache no longer holds counts as a miss after all. */
  unhit(): void {
    this.#hits--;
    this.#misses++;
  }

  add(context: string, v: Float32Array, key: string, question: string): void {
    this.#index.add(context, v, { key, question });
  }

  stats(): SimilarCacheStats {
    return {
      threshold: this.threshold,
      hits: this.#hits,
      misses: this.#misses,
      nearMisses: { ...this.#near },
      entries: this.#index.size,
      bytes: this.#index.bytes,
    };
  }
}
