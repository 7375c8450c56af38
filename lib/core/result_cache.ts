import type { FinishReason, GenerationRequest, Usage } from "./generation.ts";

/** One stored token event of a finished generation. */
export interface StoredToken {
  readonly text: string;
  readonly ids: readonly number[];
  readonly logprob: number;
}

/** What a finished deterministic generation produced, enough to replay it event for event. */
export interface StoredResult {
  readonly promptTokens: number;
  readonly tokens: readonly StoredToken[];
  readonly finishReason: FinishReason;
  readonly usage: Usage;
  /** Wall time the generation took. */
  readonly totalMs: number;
}

/**
 * The identity of a request's answer: everything that decides its tokens and nothing else
 * (not the priority, not the request id). A greedy request's seed changes nothing, so it is
 * left out; a sampled one is only cacheable with an explicit seed. Null when the request is
 * not deterministic, so it must never be answered from, or stored in, the cache.
 */
export function resultCacheKey(model: string, req: GenerationRequest): string | null {
  if (req.deterministic !== true) return null;
  const s = req.sampling;
  const greedy = s.temperature === 0;
  return JSON.stringify([
    // One API key's answers are never another's hits (nor its in-flight generations).
    req.cacheScope ?? "",
    model,
    typeof req.prompt === "string" ? req.prompt : [...req.prompt],
    req.parseSpecialTokens === true,
    req.maxTokens,
    greedy ? 0 : s.temperature,
    greedy ? 0 : s.topK,
    greedy ? 1 : s.topP,
    greedy ? 0 : s.minP,
    greedy ? 0 : s.seed,
    req.stop,
    req.stopTokenIds ?? [],
    req.logprobs === true,
  ]);
}

/** Bytes an entry costs: the key and texts as UTF-16, ids and logprobs as 8-byte numbers. */
export function storedResultBytes(key: string, r: StoredResult): number {
  let bytes = 2 * key.length + 128;
  for (const t of r.tokens) bytes += 2 * t.text.length + 8 * t.ids.length + 8 + 48;
  return bytes;
}

/**
 * A least-recently-used map of finished results, bounded by the bytes its entries cost
 * (storedResultBytes). An entry larger than the whole capacity is not stored; a capacity of 0
 * stores nothing. Pure bookkeeping: no clocks, no I/O.
 */
export class ResultCache {
  readonly capacityBytes: number;
  #entries = new Map<string, { result: StoredResult; bytes: number }>();
  #bytes = 0;
  hits = 0;
  misses = 0;
  /** Sum of the totalMs of every result answered from the cache. */
  savedMs = 0;

  constructor(capacityBytes: number) {
    if (!(Number.isFinite(capacityBytes) && capacityBytes >= 0)) {
      throw new RangeError(
        `Result cache capacity must be a non-negative number of bytes; received ${capacityBytes}`,
      );
    }
    this.capacityBytes = capacityBytes;
  }

  get bytes(): number {
    return this.#bytes;
  }

  get size(): number {
    return this.#entries.size;
  }

  /** The stored result (now the most recently used), counted as a hit or a miss. */
  get(key: string): StoredResult | undefined {
    const e = this.#entries.get(key);
    if (e === undefined) {
      this.misses++;
      return undefined;
    }
    this.#entries.delete(key);
    this.#entries.set(key, e);
    this.hits++;
    this.savedMs += e.result.totalMs;
    return e.result;
  }

  /**
   * Counts a request answered without generating though not from an entry: it followed an
   * identical request that was generating when it came.
   */
  countHit(savedMs: number): void {
    this.hits++;
    this.savedMs += savedMs;
  }

  /** Stores a result, evicting the least recently used entries until it fits. */
  set(key: string, result: StoredResult): boolean {
    const bytes = storedResultBytes(key, result);
    if (bytes > this.capacityBytes) return false;
    const old = this.#entries.get(key);
    if (old !== undefined) {
      this.#entries.delete(key);
      this.#bytes -= old.bytes;
    }
    while (this.#bytes + bytes > this.capacityBytes) {
      const oldest = this.#entries.keys().next();
      if (oldest.done) break;
      const e = this.#entries.get(oldest.value)!;
      this.#entries.delete(oldest.value);
      this.#bytes -= e.bytes;
    }
    this.#entries.set(key, { result, bytes });
    this.#bytes += bytes;
    return true;
  }
}
