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
 * ("stop" or "length"), never a cancelled or failed one. A request identical to one still
 * generating follows that one instead (see #follow). Requests that are not deterministic
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
  get specialTokens(): readonly string[] {
    return this.inner.specialTokens;
  }

  minTokens(text: string): number {
    return this.inner.minTokens?.(text) ?? 0;
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

  /** Deterministic generations running now, by key: identical requests follow them. */
  readonly #flights = new Map<string, Flight>();

  generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent> {
    const key = this.cache.capacityBytes > 0 ? resultCacheKey(this.modelName, req) : null;
    if (key === null) return this.inner.generate(req, signal);
    const flight = this.#flights.get(key);
    if (flight !== undefined) return this.#follow(flight, req, signal);
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
    const flight = new Flight();
    this.#flights.set(key, flight);
    try {
      for await (const ev of this.inner.generate(req, signal)) {
        if (ev.type === "started") flight.start(ev.promptTokens);
        else if (ev.type === "token") {
          flight.push({ text: ev.text, ids: ev.ids, logprob: ev.logprob });
        } else if (ev.type === "done" && ev.finishReason !== "cancelled" && !signal.aborted) {
          const result: StoredResult = {
            promptTokens: flight.promptTokens ?? 0,
            tokens: flight.tokens,
            finishReason: ev.finishReason,
            usage: ev.usage,
            totalMs: performance.now() - t0,
          };
          this.cache.set(key, result);
          flight.finish(result);
        }
        yield ev;
      }
    } finally {
      // Cancelled, failed or abandoned: whoever followed it generates for itself.
      flight.fail();
      if (this.#flights.get(key) === flight) this.#flights.delete(key);
    }
  }

  /**
   * An identical request while the first is still generating: its events are passed on as
   * they come instead of generating the same tokens twice. Should the first one not finish
   * (cancelled by its client, an error), this one generates after all, skipping the events it
   * already passed on (the same tokens: generation is deterministic).
   */
  async *#follow(
    flight: Flight,
    req: GenerationRequest,
    signal: AbortSignal,
  ): AsyncGenerator<GenerationEvent> {
    const t0 = performance.now();
    let started = false;
    let sent = 0;
    let sentIds = 0;
    let firstAt = -1;
    for (;;) {
      if (!started && flight.promptTokens !== undefined) {
        started = true;
        yield { type: "started", promptTokens: flight.promptTokens };
      }
      while (started && sent < flight.tokens.length && !signal.aborted) {
        if (firstAt < 0) firstAt = performance.now();
        const t = flight.tokens[sent++]!;
        sentIds += t.ids.length;
        yield { type: "token", text: t.text, ids: t.ids, logprob: t.logprob };
      }
      if (signal.aborted) {
        yield cancelledDone(flight.promptTokens ?? 0, sentIds, t0, firstAt);
        return;
      }
      if (flight.result !== undefined && sent === flight.tokens.length) {
        this.cache.countHit(flight.result.totalMs);
        yield doneFrom(flight.result, t0, firstAt, sent);
        return;
      }
      if (flight.failed) break;
      await flight.changed(signal);
    }
    // The first one did not finish: generate, passing on only what is new.
    let skipTokens = sent;
    for await (const ev of this.generate(req, signal)) {
      if (ev.type === "started" && started) continue;
      if (ev.type === "token" && skipTokens > 0) {
        skipTokens--;
        continue;
      }
      yield ev;
    }
  }
}

/** What followers of a running generation see: its events so far and how it ended. */
class Flight {
  promptTokens: number | undefined;
  readonly tokens: StoredToken[] = [];
  result: StoredResult | undefined;
  failed = false;
  #waiters: Array<() => void> = [];

  start(promptTokens: number): void {
    this.promptTokens = promptTokens;
    this.#wake();
  }
  push(t: StoredToken): void {
    this.tokens.push(t);
    this.#wake();
  }
  finish(r: StoredResult): void {
    this.result = r;
    this.#wake();
  }
  fail(): void {
    if (this.result !== undefined) return;
    this.failed = true;
    this.#wake();
  }

  /** Resolves at the next change, or when `signal` aborts. */
  changed(signal: AbortSignal): Promise<void> {
    if (signal.aborted) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        signal.removeEventListener("abort", done);
        this.#waiters = this.#waiters.filter((w) => w !== done);
        resolve();
      };
      this.#waiters.push(done);
      signal.addEventListener("abort", done, { once: true });
    });
  }

  #wake(): void {
    for (const w of this.#waiters.splice(0)) w();
  }
}

function cancelledDone(
  promptTokens: number,
  sent: number,
  t0: number,
  firstAt: number,
): GenerationEvent {
  const end = performance.now();
  const first = firstAt < 0 ? end : firstAt;
  return {
    type: "done",
    finishReason: "cancelled",
    usage: { promptTokens, completionTokens: sent, cachedTokens: 0 },
    timings: {
      queuedMs: 0,
      prefillMs: 0,
      timeToFirstTokenMs: first - t0,
      decodeMs: end - first,
      totalMs: end - t0,
      decodeTokensPerSecond: 0,
    },
  };
}

/** The done event of an answer not generated for this request (replayed or followed). */
function doneFrom(r: StoredResult, t0: number, firstAt: number, sent: number): GenerationEvent {
  const end = performance.now();
  const first = firstAt < 0 ? end : firstAt;
  const decodeMs = end - first;
  return {
    type: "done",
    finishReason: r.finishReason,
    usage: {
      promptTokens: r.promptTokens,
      completionTokens: r.usage.completionTokens,
      // No prompt token was computed for this request.
      cachedTokens: r.promptTokens,
    },
    timings: {
      queuedMs: 0,
      prefillMs: 0,
      timeToFirstTokenMs: first - t0,
      decodeMs,
      totalMs: end - t0,
      decodeTokensPerSecond: sent > 1 && decodeMs > 0 ? (sent - 1) / (decodeMs / 1000) : 0,
    },
    cached: { savedMs: r.totalMs },
  };
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
    sent++;
    yield { type: "token", text: t.text, ids: t.ids, logprob: t.logprob };
  }
  if (signal.aborted) {
    const ids = r.tokens.slice(0, sent).reduce((n, t) => n + t.ids.length, 0);
    yield cancelledDone(r.promptTokens, ids, t0, firstAt);
    return;
  }
  yield doneFrom(r, t0, firstAt, sent);
}
