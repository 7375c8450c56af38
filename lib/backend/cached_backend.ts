import { doneEvent, generationTimings } from "../core/done_event.ts";
import type {
  CoreStats,
  GenerationBackend,
  GenerationEvent,
  GenerationRequest,
  SamplingDefaults,
  SimilarHit,
  SimilarQuestion,
} from "../core/generation.ts";
import { SimilarCache } from "../core/similar_cache.ts";
import { DelegatedText } from "./delegated_text.ts";
import type { SharedResultStore } from "../core/shared_result_store.ts";

/** The cache for similar questions' settings (--similar-cache). */
export interface SimilarCacheSettings {
  /** Cosine similarity at or above which a question takes another's answer. */
  readonly threshold: number;
  readonly capacityBytes: number;
  /**
   * What questions are embedded with (--similar-cache-model); absent: the served model's own
   * embeddings, where it gives them.
   */
  readonly embedder?: TextEmbedder;
}
import { type Embedder, type TextEmbedder, textEmbedder } from "../core/embedder.ts";
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
 *
 * With a shared store (the replicas behind a router share one, see docs/cluster.md), a miss
 * of the in-process cache is looked up there before generating, a hit is kept in-process too,
 * and every answer generated here is stored there as well.
 */
export class CachedBackend extends DelegatedText<GenerationBackend> implements GenerationBackend {
  readonly cache: ResultCache;
  /** The cache for similar questions, where it is on and the model gives embeddings. */
  readonly similar: SimilarCache | undefined;
  /** What the cache for similar questions embeds a question with. */
  readonly #questions: TextEmbedder | undefined;

  constructor(
    readonly inner: GenerationBackend,
    capacityBytes: number,
    similar?: SimilarCacheSettings,
    /** The second level, shared with other servers; consulted after this cache misses. */
    readonly shared?: SharedResultStore,
  ) {
    super(inner);
    this.cache = new ResultCache(capacityBytes);
    const own = inner.embedder;
    const questions = similar?.embedder ??
      (own && textEmbedder(own, (text, opts) => inner.tokenize(text, opts)));
    if (similar && questions) {
      this.#questions = questions;
      this.similar = new SimilarCache(
        similar.threshold,
        questions.dimensions,
        similar.capacityBytes,
      );
    }
  }

  get modelName(): string {
    return this.inner.modelName;
  }
  get samplingDefaults(): SamplingDefaults | undefined {
    return this.inner.samplingDefaults;
  }
  /** Embeddings are computed each time: the result cache holds generations. */
  get embedder(): Embedder | undefined {
    return this.inner.embedder;
  }
  get rerankPrompt(): string | undefined {
    return this.inner.rerankPrompt;
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
        ...(this.similar ? { similar: this.similar.stats() } : {}),
        ...(this.shared ? { shared: this.shared.stats() } : {}),
      },
    };
  }

  /** Deterministic generations running now, by key: identical requests follow them. */
  readonly #flights = new Map<string, Flight>();

  generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent> {
    const key = this.cache.capacityBytes > 0 ? resultCacheKey(this.modelName, req) : null;
    if (key === null) return this.inner.generate(req, signal);
    const known = this.#known(key, signal);
    if (known !== undefined) return known;
    if (this.shared) return this.#viaShared(key, req, this.shared, signal);
    return this.#afterMiss(key, req, signal);
  }

  /** What an exact miss does: the cache for similar questions, else generating. */
  #afterMiss(
    key: string,
    req: GenerationRequest,
    signal: AbortSignal,
  ): AsyncIterable<GenerationEvent> {
    if (this.similar && req.similar) return this.#viaSimilar(key, req, req.similar, signal);
    return this.#consume(this.#launch(key, req), signal, true);
  }

  /**
   * The in-process cache missed: the shared store may hold the answer another server
   * generated. A hit is replayed and kept here; a miss (or a store that cannot be reached,
   * which the store counts and logs) goes on as a miss.
   */
  async *#viaShared(
    key: string,
    req: GenerationRequest,
    shared: SharedResultStore,
    signal: AbortSignal,
  ): AsyncGenerator<GenerationEvent> {
    const found = await shared.get(key, req.cacheScope ?? "");
    if (found !== undefined) {
      this.cache.missAnsweredElsewhere(found.totalMs);
      this.cache.set(key, found);
      yield* replay(found, signal);
      return;
    }
    // An identical request may have started while the store was asked, or even finished and
    // left its answer here (a store slower than a short generation).
    yield* this.#known(key, signal) ?? this.#afterMiss(key, req, signal);
  }

  /**
   * The answer to `key` where this server already has it: an identical generation running
   * now (followed), or a stored answer (replayed); undefined when neither.
   */
  #known(key: string, signal: AbortSignal): AsyncIterable<GenerationEvent> | undefined {
    const flight = this.#flights.get(key);
    if (flight !== undefined && !flight.abandoned) return this.#consume(flight, signal, false);
    const stored = this.cache.get(key);
    return stored === undefined ? undefined : replay(stored, signal);
  }

  /**
   * A chat question the exact cache misses: its embedding looks for a similar question asked
   * in the same context (tenant, model, sampling, conversation so far) whose answer is still
   * stored, and replays that answer, marked; else the answer is generated and stored under
   * this question too. An embedding that fails leaves the request to the core, logged.
   */
  async *#viaSimilar(
    key: string,
    req: GenerationRequest,
    q: SimilarQuestion,
    signal: AbortSignal,
  ): AsyncGenerator<GenerationEvent> {
    const similar = this.similar!;
    // The conversation so far as text, beside everything else that decides the answer.
    const context = JSON.stringify([
      q.context,
      resultCacheKey(this.modelName, { ...req, prompt: [] }),
    ]);
    let v: Float32Array | undefined;
    try {
      v = await this.#questions!.embed(q.question, signal);
    } catch (e) {
      console.warn(`similar cache: the question's embedding failed, generating: ${e}`);
    }
    if (v !== undefined) {
      const hit = similar.lookup(context, v);
      const stored = hit && this.cache.get(hit.key);
      if (hit && stored) {
        yield* replay(stored, signal, { score: hit.score, matched: hit.matched });
        return;
      }
      if (hit) similar.unhit();
    }
    // An identical request may have started while the question was embedded, or finished.
    const known = this.#known(key, signal);
    if (known !== undefined) {
      yield* known;
      return;
    }
    const onStored = v && (() => similar.add(context, v, key, q.question));
    yield* this.#consume(this.#launch(key, req, onStored), signal, true);
  }

  /**
   * Starts the generation that identical requests share. It is pulled from the core by a pump
   * of its own, one event whenever some consumer has taken everything so far: a lone client
   * that stops reading still holds its sequence (the core decodes nothing for it), but a
   * follower never waits on another client's socket (a leader that stopped reading an SSE
   * stream held its followers indefinitely). It is cancelled once nobody consumes it.
   */
  #launch(key: string, req: GenerationRequest, onStored?: () => void): Flight {
    const flight = new Flight();
    this.#flights.set(key, flight);
    const t0 = performance.now();
    const pump = async () => {
      const it = this.inner.generate(req, flight.ctrl.signal)[Symbol.asyncIterator]();
      try {
        for (;;) {
          await flight.demand();
          const n = await it.next();
          if (n.done) break;
          const ev = n.value;
          if (ev.type === "started") flight.start(ev.promptTokens);
          else if (ev.type === "token") {
            flight.push({ text: ev.text, ids: ev.ids, logprob: ev.logprob });
          } else if (ev.type === "error") return flight.end({ error: ev });
          else if (ev.finishReason === "cancelled" || flight.ctrl.signal.aborted) {
            return flight.end({ cancelled: true });
          } else {
            const result: StoredResult = {
              promptTokens: flight.promptTokens ?? 0,
              tokens: flight.tokens,
              finishReason: ev.finishReason,
              ...(ev.stopString === undefined ? {} : { stopString: ev.stopString }),
              usage: ev.usage,
              totalMs: performance.now() - t0,
            };
            this.cache.set(key, result);
            // Not awaited: the store counts and logs its own failures.
            void this.shared?.set(key, req.cacheScope ?? "", result);
            onStored?.();
            return flight.end({ result, done: ev });
          }
        }
        flight.end({
          error: { type: "error", code: "internal", message: "The core ended without done" },
        });
      } catch (e) {
        const message = `Generation failed: ${e instanceof Error ? e.message : String(e)}`;
        flight.end({ error: { type: "error", code: "internal", message } });
      } finally {
        if (this.#flights.get(key) === flight) this.#flights.delete(key);
        try {
          await it.return?.();
        } catch { /* the core failed while ending; already reported */ }
      }
    };
    flight.onAbandoned = () => {
      if (this.#flights.get(key) === flight) this.#flights.delete(key);
    };
    void pump();
    return flight;
  }

  /**
   * One request's view of a shared generation, at its own pace. The first request (`leader`)
   * gets the core's own done event; the others get the stored answer's, marked `cached`.
   */
  async *#consume(
    flight: Flight,
    signal: AbortSignal,
    leader: boolean,
  ): AsyncGenerator<GenerationEvent> {
    flight.attach();
    const t0 = performance.now();
    let started = false;
    let sent = 0;
    let sentIds = 0;
    let firstAt = -1;
    try {
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
        const end = flight.ending;
        if (end !== undefined && sent === flight.tokens.length) {
          if ("error" in end) yield end.error;
          else if ("cancelled" in end) {
            yield cancelledDone(flight.promptTokens ?? 0, sentIds, t0, firstAt);
          } else if (leader) yield end.done;
          else {
            this.cache.countHit(end.result.totalMs);
            yield doneFrom(end.result, t0, firstAt, sent);
          }
          return;
        }
        await flight.changed(signal);
      }
    } finally {
      flight.detach();
    }
  }
}

type FlightEnd =
  | { readonly result: StoredResult; readonly done: GenerationEvent }
  | { readonly error: Extract<GenerationEvent, { type: "error" }> }
  | { readonly cancelled: true };

/** A generation shared by identical requests: its events so far and how it ended. */
class Flight {
  readonly ctrl = new AbortController();
  promptTokens: number | undefined;
  readonly tokens: StoredToken[] = [];
  ending: FlightEnd | undefined;
  onAbandoned: (() => void) | undefined;
  #consumers = 0;
  #waiting = 0;
  #waiters: Array<() => void> = [];
  #demand: (() => void) | undefined;

  /** Nobody consumes it any more: it is being cancelled, and new requests must not join. */
  get abandoned(): boolean {
    return this.ctrl.signal.aborted;
  }

  attach(): void {
    this.#consumers++;
  }
  detach(): void {
    if (--this.#consumers === 0 && this.ending === undefined) {
      this.ctrl.abort("client gone");
      this.onAbandoned?.();
      this.#demand?.();
    }
  }

  start(promptTokens: number): void {
    this.promptTokens = promptTokens;
    this.#wake();
  }
  push(t: StoredToken): void {
    this.tokens.push(t);
    this.#wake();
  }
  end(how: FlightEnd): void {
    this.ending ??= how;
    this.#wake();
  }

  /** Resolves once a consumer waits for the next event (or nobody is left to wait). */
  demand(): Promise<void> {
    if (this.#waiting > 0 || this.ctrl.signal.aborted) return Promise.resolve();
    return new Promise((resolve) => this.#demand = resolve);
  }

  /** Resolves at the next change, or when `signal` aborts; meanwhile this is demand. */
  changed(signal: AbortSignal): Promise<void> {
    if (signal.aborted) return Promise.resolve();
    this.#waiting++;
    const d = this.#demand;
    this.#demand = undefined;
    d?.();
    return new Promise((resolve) => {
      const done = () => {
        this.#waiting--;
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

/** A follower's or a replay's done event after an abort: what it had sent, no prompt computed. */
function cancelledDone(
  promptTokens: number,
  sent: number,
  t0: number,
  firstAt: number,
): GenerationEvent {
  return doneEvent(
    "cancelled",
    { promptTokens, completionTokens: sent, cachedTokens: 0 },
    // Nothing is queued or prefilled for it: the wait for its first token counts as prefill.
    { start: t0, scheduled: t0, ...(firstAt < 0 ? {} : { firstToken: firstAt }) },
  );
}

/**
 * The done event of an answer not generated for this request (replayed or followed): its
 * decode rate is over the `sent` chunks it was sent in.
 */
function doneFrom(
  r: StoredResult,
  t0: number,
  firstAt: number,
  sent: number,
  similar?: SimilarHit,
): GenerationEvent {
  const clock = { start: t0, scheduled: t0, ...(firstAt < 0 ? {} : { firstToken: firstAt }) };
  return doneEvent(
    r.finishReason,
    {
      promptTokens: r.promptTokens,
      completionTokens: r.usage.completionTokens,
      // No prompt token was computed for this request.
      cachedTokens: r.promptTokens,
    },
    generationTimings(clock, sent),
    { savedMs: r.totalMs, ...(similar ? { similar } : {}) },
    r.stopString,
  );
}

/** The stored events again, as fast as the consumer takes them; an abort ends it "cancelled". */
async function* replay(
  r: StoredResult,
  signal: AbortSignal,
  similar?: SimilarHit,
): AsyncGenerator<GenerationEvent> {
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
  yield doneFrom(r, t0, firstAt, sent, similar);
}
