import type {
  CoreStats,
  FinishReason,
  GenerationBackend,
  GenerationEvent,
  GenerationRequest,
} from "../lib/core/generation.ts";
import { trace } from "@opentelemetry/api";
import { hash32 } from "../lib/util/rng.ts";

/**
 * A stand-in for the serving core, used to test and demo the client-facing layer without a
 * model: tokens are words picked deterministically from the prompt and the sampling seed, one
 * every `tokenDelayMs`. It keeps the core's observable behaviour: a bounded queue (beyond it
 * the first event is an "overloaded" error), running/waiting counts, KV blocks that grow with
 * each sequence and return to the pool when it ends, and abort = cancel.
 */
export interface FakeBackendOptions {
  readonly modelName?: string;
  readonly contextLength?: number;
  /** Delay before each token; 0 yields as fast as the consumer pulls. */
  readonly tokenDelayMs?: number;
  /** Sequences generating at once; later ones wait. */
  readonly maxRunning?: number;
  /** Sequences allowed to wait; beyond running + waiting, generate() answers "overloaded". */
  readonly maxWaiting?: number;
  readonly kvBlockSize?: number;
  readonly kvBlocksTotal?: number;
  readonly chatTemplate?: string;
  /** Extra characters appended to every token's text, to make large frames (backpressure tests). */
  readonly tokenPadding?: number;
  /** A prompt containing this string fails with an "internal" error after two tokens. */
  readonly failMarker?: string;
  /**
   * Record an "llm.step" span per token, linked to the span active when the core is called
   * (the request span), the way the real executor links its step spans.
   */
  readonly traceSteps?: boolean;
}

const WORDS = [
  "once",
  "upon",
  "a",
  "time",
  "there",
  "was",
  "little",
  "girl",
  "named",
  "lily",
  "she",
  "liked",
  "to",
  "play",
  "in",
  "the",
  "park",
  "with",
  "her",
  "dog",
  "sun",
  "was",
  "bright",
  "and",
  "happy",
  "tree",
  "big",
  "red",
  "ball",
  "friend",
];

/** The id the fake tokenizer gives a word: stable, in [3, 512). */
export function fakeTokenId(word: string): number {
  let h = 0;
  for (let i = 0; i < word.length; i++) h = hash32(h, word.charCodeAt(i));
  return 3 + (h % 509);
}

/** Prompt token count as the fake core sees it: BOS plus one token per whitespace-separated word. */
export function fakeCountTokens(text: string): number {
  const words = text.split(/\s+/).filter((w) => w.length > 0);
  return 1 + words.length;
}

/** The i-th token the fake core generates for a prompt and seed (text and id). */
export function fakeToken(
  prompt: string | readonly number[],
  seed: number,
  i: number,
  padding = 0,
): { text: string; id: number } {
  const key = typeof prompt === "string" ? prompt : prompt.join(",");
  let h = seed >>> 0;
  for (let c = 0; c < key.length; c++) h = hash32(h, key.charCodeAt(c));
  const word = WORDS[hash32(h, i) % WORDS.length] ?? "a";
  return { text: " " + word + "~".repeat(padding), id: fakeTokenId(word) };
}

export class FakeBackend implements GenerationBackend {
  readonly modelName: string;
  readonly contextLength: number;
  readonly chatTemplate?: string;
  readonly bosToken = "<s>";
  readonly eosToken = "</s>";
  /** Every request the core has been asked to run, in order (tests assert the mapping). */
  readonly requests: GenerationRequest[] = [];
  /** Token events yielded so far, over all generations (tests watch it stop under backpressure). */
  tokensYielded = 0;
  /** Set false to make /ready report an executor failure. */
  executorHealthy = true;
  steps = 0;
  lastBatchSize = 0;

  #opts: Required<
    Omit<FakeBackendOptions, "chatTemplate" | "modelName" | "failMarker" | "traceSteps">
  >;
  #traceSteps: boolean;
  #failMarker: string | undefined;
  #running = 0;
  #waiters: Array<() => void> = [];
  /** KV positions held by each live sequence. */
  #held = new Map<number, number>();
  #nextSeq = 0;

  constructor(opts: FakeBackendOptions = {}) {
    this.modelName = opts.modelName ?? "fake-llama";
    this.contextLength = opts.contextLength ?? 128;
    if (opts.chatTemplate !== undefined) this.chatTemplate = opts.chatTemplate;
    this.#failMarker = opts.failMarker;
    this.#traceSteps = opts.traceSteps ?? false;
    this.#opts = {
      contextLength: this.contextLength,
      tokenDelayMs: opts.tokenDelayMs ?? 0,
      maxRunning: opts.maxRunning ?? 8,
      maxWaiting: opts.maxWaiting ?? 8,
      kvBlockSize: opts.kvBlockSize ?? 16,
      kvBlocksTotal: opts.kvBlocksTotal ?? 256,
      tokenPadding: opts.tokenPadding ?? 0,
    };
  }

  /** Generations that have been admitted and not yet ended (running + waiting). */
  get active(): number {
    return this.#held.size;
  }

  countTokens(text: string): number {
    return fakeCountTokens(text);
  }

  /** BOS (id 1) and one id per whitespace-separated word, like fakeCountTokens. */
  tokenize(text: string, opts: { bos: boolean; special: boolean }): number[] {
    const ids = opts.bos ? [1] : [];
    for (const w of text.split(/\s+/).filter((w) => w.length > 0)) {
      const id = fakeTokenId(w);
      this.#words.set(id, w);
      ids.push(id);
    }
    return ids;
  }

  /** Words this fake has tokenized or generated, space-separated; BOS and EOS vanish. */
  detokenize(ids: readonly number[]): string {
    return ids.filter((id) => id > 2).map((id) => {
      if (!Number.isInteger(id) || id < 0 || id >= 512) {
        throw new RangeError(`Cannot decode token id ${id}: the vocabulary has ids 0..511`);
      }
      return this.#words.get(id) ?? `<unk${id}>`;
    }).join(" ");
  }

  tokenPiece(id: number): string {
    if (id === 1) return this.bosToken;
    if (id === 2) return this.eosToken;
    return " " + this.detokenize([id]);
  }

  #words = new Map<number, string>(WORDS.map((w) => [fakeTokenId(w), w]));

  stats(): CoreStats {
    let blocks = 0;
    for (const positions of this.#held.values()) {
      blocks += Math.ceil(positions / this.#opts.kvBlockSize);
    }
    return {
      running: this.#running,
      waiting: this.#waiters.length,
      kvBlocksUsed: blocks,
      kvBlocksTotal: this.#opts.kvBlocksTotal,
      prefixCacheHitRate: 0,
      steps: this.steps,
      lastBatchSize: this.lastBatchSize,
      executorHealthy: this.executorHealthy,
    };
  }

  generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent> {
    this.requests.push(req);
    return this.#run(req, signal);
  }

  async *#run(req: GenerationRequest, signal: AbortSignal): AsyncGenerator<GenerationEvent> {
    const t0 = performance.now();
    const o = this.#opts;
    if (this.#held.size >= o.maxRunning + o.maxWaiting) {
      yield {
        type: "error",
        code: "overloaded",
        message: `Cannot queue request ${req.requestId}: ${this.#held.size} sequences are ` +
          `running or waiting, the limit is ${o.maxRunning + o.maxWaiting}`,
      };
      return;
    }
    const promptTokens = typeof req.prompt === "string"
      ? fakeCountTokens(req.prompt)
      : req.prompt.length;
    if (promptTokens >= this.contextLength) {
      yield {
        type: "error",
        code: "context_length_exceeded",
        message: `Prompt has ${promptTokens} tokens; the context is ${this.contextLength}`,
      };
      return;
    }
    const seq = this.#nextSeq++;
    this.#held.set(seq, 0);
    let admitted = false;
    try {
      yield { type: "started", promptTokens };
      if (this.#running < o.maxRunning) {
        this.#running++;
        admitted = true;
      } else {
        admitted = await this.#waitForSlot(signal);
      }
      const tAdmit = performance.now();
      this.#held.set(seq, promptTokens);
      let text = "";
      let n = 0;
      let firstAt = tAdmit;
      let finish: FinishReason = "length";
      while (n < req.maxTokens && promptTokens + n < this.contextLength) {
        if (!(await this.#pause(signal))) {
          finish = "cancelled";
          break;
        }
        if (
          this.#failMarker !== undefined && typeof req.prompt === "string" &&
          req.prompt.includes(this.#failMarker) && n === 2
        ) {
          yield { type: "error", code: "internal", message: "fake executor failure (failMarker)" };
          return;
        }
        const tok = fakeToken(req.prompt, req.sampling.seed, n, o.tokenPadding);
        n++;
        this.steps++;
        if (this.#traceSteps) this.#traceStep(this.#running);
        this.lastBatchSize = this.#running;
        this.#held.set(seq, promptTokens + n);
        const candidate = text + tok.text;
        const stopAt = firstStop(candidate, req.stop);
        if (stopAt >= 0) {
          const delta = candidate.slice(text.length, stopAt);
          if (delta.length > 0) {
            this.tokensYielded++;
            yield { type: "token", text: delta, ids: [tok.id], logprob: -Math.log(WORDS.length) };
          }
          finish = "stop";
          break;
        }
        text = candidate;
        if (n === 1) firstAt = performance.now();
        this.tokensYielded++;
        yield { type: "token", text: tok.text, ids: [tok.id], logprob: -Math.log(WORDS.length) };
      }
      if (signal.aborted) finish = "cancelled";
      const end = performance.now();
      yield {
        type: "done",
        finishReason: finish,
        usage: { promptTokens, completionTokens: n, cachedTokens: 0 },
        timings: {
          queuedMs: tAdmit - t0,
          prefillMs: 0,
          timeToFirstTokenMs: firstAt - t0,
          decodeMs: end - firstAt,
          totalMs: end - t0,
          decodeTokensPerSecond: n > 1 ? (n - 1) / ((end - firstAt) / 1000) : 0,
        },
      };
    } finally {
      this.#held.delete(seq);
      if (admitted) {
        // The slot passes straight to the next waiter so a newcomer cannot overtake it.
        const next = this.#waiters.shift();
        if (next) next();
        else this.#running--;
      }
    }
  }

  /** Queues for a running slot; true when one was handed over, false when aborted first. */
  #waitForSlot(signal: AbortSignal): Promise<boolean> {
    return new Promise<boolean>((resolve) => {
      const wake = () => {
        signal.removeEventListener("abort", leave);
        resolve(true);
      };
      const leave = () => {
        this.#waiters = this.#waiters.filter((w) => w !== wake);
        resolve(false);
      };
      this.#waiters.push(wake);
      signal.addEventListener("abort", leave, { once: true });
    });
  }

  #traceStep(batchSize: number): void {
    const request = trace.getActiveSpan();
    trace.getTracer("llmserve-fake-core").startSpan("llm.step", {
      attributes: { "llm.batch_size": batchSize, "llm.step.tokens": batchSize },
      links: request === undefined ? [] : [{ context: request.spanContext() }],
      // A step serves many requests, so it is a root span linked to them, not a child.
      root: true,
    }).end();
  }

  /** Waits one token delay; false when aborted. */
  #pause(signal: AbortSignal): Promise<boolean> {
    if (signal.aborted) return Promise.resolve(false);
    const ms = this.#opts.tokenDelayMs;
    if (ms <= 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const onAbort = () => {
        clearTimeout(timer);
        resolve(false);
      };
      const timer = setTimeout(() => {
        signal.removeEventListener("abort", onAbort);
        resolve(true);
      }, ms);
      signal.addEventListener("abort", onAbort, { once: true });
    });
  }
}

function firstStop(text: string, stops: readonly string[]): number {
  let best = -1;
  for (const s of stops) {
    if (s.length === 0) continue;
    const at = text.indexOf(s);
    if (at >= 0 && (best < 0 || at < best)) best = at;
  }
  return best;
}
