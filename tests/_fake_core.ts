/**
 * The real serving core behind the HTTP layer, with only the model faked: CoreBackend →
 * ServingCore (request actors, scheduler, executor) → FakeEngine, tokenized by the real
 * stories260K tokenizer (tok512.bin). Overload, stop strings, KV accounting, cancellation and
 * restarts are the core's own rules; the fake engine draws word tokens (" the", " was", ...)
 * from a hash of everything it reads from its paged KV cache, so `continuation()` is an
 * independent oracle for the text.
 */
import { ServingCore } from "../actors/core.ts";
import type { GenerationEvent, GenerationRequest } from "../lib/core/generation.ts";
import { GREEDY, type SamplingParams, type StepPlan } from "../lib/engine/engine.ts";
import { CoreBackend, type EmbeddingSettings } from "../lib/backend/core_backend.ts";
import { type GrammarServiceOptions, lazyGrammarService } from "../lib/grammar/grammar_service.ts";
import { parseLlama2cTokenizer } from "../lib/tokenizer/llama2c_tokenizer.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { fakeContinuation, FakeEngine, type FakeEngineOptions } from "./harness/fake_engine.ts";
import { modelFile } from "./harness/model_files.ts";

export const TOKENIZER = new Tokenizer(
  parseLlama2cTokenizer(await Deno.readFile(modelFile("tok512.bin")), 512, "tok512.bin"),
);

/** Whole-word pieces of the vocabulary: what the fake model says. */
export const WORD_IDS: readonly number[] = Array.from({ length: TOKENIZER.vocabSize }, (_, i) => i)
  .filter((i) => /^ [a-z]{2,}$/.test(TOKENIZER.tokenText(i)));

export interface FakeCoreOptions {
  readonly modelName?: string;
  /** The fake model's context (default 128). */
  readonly contextLength?: number;
  /** Each engine step resolves this many ms after it was called (default: at once). */
  readonly tokenDelayMs?: number;
  /** Scheduler limits (defaults 8 and 8). */
  readonly maxRunning?: number;
  readonly maxWaiting?: number;
  /** KV pool geometry (defaults 16 tokens × 256 blocks). */
  readonly kvBlockSize?: number;
  readonly kvBlocksTotal?: number;
  readonly chatTemplate?: string;
  /** Options of the real grammar service behind constrained requests (its limits, its bundle). */
  readonly grammar?: GrammarServiceOptions;
  /**
   * The engine crashes on every step that would compute a third generated token of a prompt
   * containing this text: the real core restarts it, recomputes, and after maxSeqFaults fails
   * that request with an internal error (its first two tokens already streamed).
   */
  readonly failMarker?: string;
  /** Characters appended to each token's text on its way out (large frames for backpressure). */
  readonly tokenPadding?: number;
  /** Holds steps' results (FakeEngineOptions.holdWhen). */
  readonly holdWhen?: FakeEngineOptions["holdWhen"];
  /** Embeddings from the fake engine's hidden rows, pooled and normalized so (default: none). */
  readonly embedding?: EmbeddingSettings;
}

export class FakeCore extends CoreBackend {
  readonly serving: ServingCore;
  /** Every request the HTTP layer handed to the core, in order. */
  readonly requests: GenerationRequest[] = [];
  /** Token events the core has produced so far, over all generations. */
  tokensYielded = 0;
  /** Whether engine crashes are expected (failMarker, breakEngine), for the restart check. */
  injectsFaults: boolean;
  #active = 0;
  #padding: string;
  #engineOpts: FakeEngineOptions;

  constructor(opts: FakeCoreOptions = {}) {
    const contextLength = opts.contextLength ?? 128;
    const broken = { now: false };
    const poisoned = new Map<number, number>(); // seqId -> end of its prompt
    const markerIds = opts.failMarker === undefined
      ? undefined
      : TOKENIZER.encode(opts.failMarker, { bos: false });
    const engineOpts: FakeEngineOptions = {
      vocabSize: TOKENIZER.vocabSize,
      outputIds: WORD_IDS,
      contextLength,
      blockSize: opts.kvBlockSize ?? 16,
      numBlocks: opts.kvBlocksTotal ?? 256,
      latencyMs: opts.tokenDelayMs ?? 0,
      ...(opts.holdWhen ? { holdWhen: opts.holdWhen } : {}),
      failWhen: (plan: StepPlan) => {
        if (broken.now) return true;
        if (!markerIds) return false;
        for (const s of plan.seqs) {
          if (!poisoned.has(s.seqId) && containsRun(s.tokens, markerIds)) {
            poisoned.set(s.seqId, s.startPos + s.tokens.length);
          }
          const promptEnd = poisoned.get(s.seqId);
          const end = s.startPos + (s.useLastSampled ? 1 : s.tokens.length);
          if (promptEnd !== undefined && s.sample && end >= promptEnd + 2) return true;
        }
        return false;
      },
    };
    const engines: FakeEngine[] = [new FakeEngine(engineOpts)];
    const core = new ServingCore({
      engine: engines[0]!,
      engineFactory: () => {
        if (broken.now) throw new Error("fake engine: the device is gone (breakEngine)");
        engines.push(new FakeEngine(engineOpts));
        return engines.at(-1)!;
      },
      codec: TOKENIZER,
      grammars: lazyGrammarService(TOKENIZER, TOKENIZER.vocabSize, opts.grammar),
      scheduler: { maxRunning: opts.maxRunning ?? 8, maxWaiting: opts.maxWaiting ?? 8 },
      executor: {
        log: (line) => (markerIds || broken.now ? undefined : console.error(line)),
        restartBackoffMs: 1,
      },
    });
    super(
      opts.modelName ?? "fake-llama",
      core,
      TOKENIZER,
      opts.chatTemplate,
      undefined,
      opts.embedding,
    );
    this.serving = core;
    this.injectsFaults = markerIds !== undefined;
    this.#padding = "~".repeat(opts.tokenPadding ?? 0);
    this.#engineOpts = engineOpts;
    this.#broken = broken;
    this.#engines = engines;
  }

  #engines: FakeEngine[];

  /** Token rows the fake engines have computed (prompts, recomputations and decodes). */
  get tokensComputed(): number {
    return this.#engines.reduce((n, e) => n + e.tokensComputed, 0);
  }

  #broken: { now: boolean };

  /**
   * From now on every step crashes the engine and no new one can be built: the next step the
   * core runs takes the executor down for good (what /ready must report).
   */
  breakEngine(): void {
    this.#broken.now = true;
    this.injectsFaults = true;
  }

  /** Generations the HTTP layer has started whose event stream has not ended. */
  get active(): number {
    return this.#active;
  }

  override generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent> {
    this.requests.push(req);
    const events = super.generate(req, signal);
    this.#active++;
    let ended = false;
    const end = () => {
      if (!ended) this.#active--;
      ended = true;
    };
    const padding = this.#padding;
    const counted = async function* (self: FakeCore): AsyncGenerator<GenerationEvent> {
      try {
        for await (const ev of events) {
          if (ev.type === "token") {
            self.tokensYielded++;
            yield padding === "" ? ev : { ...ev, text: ev.text + padding };
          } else yield ev;
        }
      } finally {
        end();
      }
    };
    return counted(this);
  }

  /**
   * What the fake model generates for a prompt alone (computed without the core): ids and
   * their text, as the vocabulary spells them. Stops at maxTokens or the context.
   */
  continuation(
    prompt: string | readonly number[],
    maxTokens: number,
    sampling: SamplingParams = GREEDY,
  ): { ids: number[]; text: string } {
    const ids = typeof prompt === "string"
      ? this.tokenize(prompt, { bos: true, special: false })
      : prompt;
    const out = fakeContinuation(ids, {
      maxTokens,
      contextLength: this.#engineOpts.contextLength!,
      vocabSize: TOKENIZER.vocabSize,
      sampling,
      outputIds: WORD_IDS,
    });
    let text = out.map((id) => TOKENIZER.tokenText(id)).join("");
    // SentencePiece drops the space that starts the first piece after BOS.
    if (ids.at(-1) === TOKENIZER.bosId) text = text.slice(1);
    return { ids: out, text };
  }

  /** Engine restarts so far. */
  get restarts(): number {
    return this.serving.executor.restarts;
  }

  async close(): Promise<void> {
    await this.serving.close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

function containsRun(tokens: readonly number[], run: readonly number[]): boolean {
  outer: for (let i = 0; i + run.length <= tokens.length; i++) {
    for (let j = 0; j < run.length; j++) if (tokens[i + j] !== run[j]) continue outer;
    return true;
  }
  return false;
}
