import type {
  CoreStats,
  GenerationBackend,
  GenerationEvent,
  GenerationRequest,
} from "../core/generation.ts";
import {
  ResultCache,
  resultCacheKey,
  type StoredResult,
  type StoredToken,
} from "../core/result_cache.ts";

/**
 * A GenerationBackend that answers repeated deterministic requests from a ResultCache.
 *
 * Our outputs are batch-invariant and the sampler's draw depends only on the seed and the
 * position, so a stored answer is exactly what generating again would give. A hit replays the
 * stored events (started, every token event, done) without touching the core, with `cached`
 * on the done event; a miss runs the core and stores the answer when it finished on its own
 * ("stop" or "length"), never a cancelled or failed one. Requests that are not deterministic
 * (sampled without an explicit seed) pass straight through.
 */
export class CachedBackend implements GenerationBackend {
  readonly cache: ResultCache;

  constructor(readonly inner: GenerationBackend, capacityBytes: number) {
    this.cache = new ResultCache(capacityBytes);
  }

  get modelName(): string {
    return this.inner.modelName;
  }
  get contextLength(): number {
    return this.inner.contextLength;
  }
  get vocabSize(): number | undefined {
    return this.inner.vocabSize;
  }
  get chatTemplate(): string | undefined {
    return this.inner.chatTemplate;
  }
  get bosToken(): string {
    return this.inner.bosToken;
  }
  get eosToken(): string {
    return this.inner.eosToken;
  }

  countTokens(text: string, opts?: { special?: boolean }): number {
    return this.inner.countTokens(text, opts);
  }
  tokenize(text: string, opts: { bos: boolean; special: boolean }): number[] {
    return this.inner.tokenize(text, opts);
  }
  detokenize(ids: readonly number[]): string {
    return this.inner.detokenize(ids);
  }
  tokenPiece(id: number): string {
    return this.inner.tokenPiece(id);
  }

  stats(): CoreStats {
    const c = this.cache;
    return {
      ...this.inner.stats(),
      resultCache: {
        hits: c.hits,
        misses: c.misses,
        bytes: c.bytes,
        capacityBytes: c.capacityBytes,
        entries: c.size,
        savedMs: c.savedMs,
      },
    };
  }

  generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent> {
    const key = this.cache.capacityBytes > 0 ? resultCacheKey(this.modelName, req) : null;
    if (key === null) return this.inner.generate(req, signal);
    const stored = this.cache.get(key);
    if (stored !== undefined) return replay(stored, signal);
    return this.#generateAndStore(key, req, signal);
  }

  async *#generateAndStore(
    key: string,
    req: GenerationRequest,
    signal: AbortSignal,
  ): AsyncGenerator<GenerationEvent> {
    const t0 = performance.now();
    let promptTokens = 0;
    const tokens: StoredToken[] = [];
    for await (const ev of this.inner.generate(req, signal)) {
      if (ev.type === "started") promptTokens = ev.promptTokens;
      else if (ev.type === "token") {
        tokens.push({ text: ev.text, ids: ev.ids, logprob: ev.logprob });
      } else if (ev.type === "done" && ev.finishReason !== "cancelled" && !signal.aborted) {
        this.cache.set(key, {
          promptTokens,
          tokens,
          finishReason: ev.finishReason,
          usage: ev.usage,
          totalMs: performance.now() - t0,
        });
      }
      yield ev;
    }
  }
}

/** The stored events again, as fast as the consumer takes them; an abort ends it "cancelled". */
async function* replay(r: StoredResult, signal: AbortSignal): AsyncGenerator<GenerationEvent> {
  const t0 = performance.now();
  yield { type: "started", promptTokens: r.promptTokens };
  let firstAt = -1;
  let sent = 0;
  for (const t of r.tokens) {
    if (signal.aborted) break;
    if (firstAt < 0) firstAt = performance.now();
    sent += t.ids.length;
    yield { type: "token", text: t.text, ids: t.ids, logprob: t.logprob };
  }
  const end = performance.now();
  const cancelled = signal.aborted;
  if (firstAt < 0) firstAt = end;
  const decodeMs = end - firstAt;
  yield {
    type: "done",
    finishReason: cancelled ? "cancelled" : r.finishReason,
    usage: {
      promptTokens: r.promptTokens,
      completionTokens: cancelled ? sent : r.usage.completionTokens,
      // No prompt token was computed for a replay.
      cachedTokens: r.promptTokens,
    },
    timings: {
      queuedMs: 0,
      prefillMs: 0,
      timeToFirstTokenMs: firstAt - t0,
      decodeMs,
      totalMs: end - t0,
      decodeTokensPerSecond: sent > 1 && decodeMs > 0 ? (sent - 1) / (decodeMs / 1000) : 0,
    },
    cached: { savedMs: r.totalMs },
  };
}
