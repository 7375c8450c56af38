import type { Engine } from "../lib/engine/engine.ts";
import type { CoreStats, GenerationEvent, GenerationRequest } from "../lib/core/generation.ts";
import { type SchedulerConfig, schedulerConfig } from "../lib/core/scheduler.ts";
import { Channel } from "./channel.ts";
import { DEFAULT_LIMITS, defaultPipelineDepth } from "../lib/engine/limits.ts";
import { type EngineFactory, ExecutorActor, type ExecutorOptions } from "./executor.ts";
import type { SchedulerStats } from "./messages.ts";
import { type ConstraintCompiler, RequestActor, type TextCodec } from "./request.ts";
import { createExecutorMailbox, SchedulerActor } from "./scheduler.ts";
import { StepTracer } from "./step_tracing.ts";
import type { Link } from "@opentelemetry/api";
import { embedPrompt } from "./embedding.ts";
import type { Pooling } from "../lib/engine/pooling.ts";
import type { Priority } from "../lib/core/generation.ts";

export interface ServingCoreOptions {
  /** The engine to start with (its kv geometry and context length size the scheduler). */
  readonly engine: Engine;
  /** Builds a replacement engine after a failure. */
  readonly engineFactory: EngineFactory;
  readonly codec: TextCodec;
  /** Overrides of the scheduler's limits (maxBatchTokens, maxRunning, maxWaiting, ...). */
  readonly scheduler?: Partial<SchedulerConfig>;
  /** Steps planned ahead of their results (default: defaultPipelineDepth for the engine). */
  readonly maxInFlight?: number;
  readonly executor?: ExecutorOptions;
  /** Events buffered per client before its generation waits for it (default 16). */
  readonly clientBuffer?: number;
  /** Compiles output constraints (constrained decoding); absent: constrained requests fail. */
  readonly grammars?: ConstraintCompiler;
  /**
   * The clock of the generations' timings, in ms (default performance.now). A test passes a
   * logical one (engine steps counted) so that its timings do not depend on machine speed.
   */
  readonly now?: () => number;
}

/**
 * The serving core wired together: engine → ExecutorActor ⇄ SchedulerActor ← RequestActor per
 * generation. generate() and stats() are what the HTTP layer's GenerationBackend needs.
 *
 * @example
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { GREEDY } from "../lib/engine/engine.ts";
 * import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
 * import { loadModel } from "../lib/model/load_model.ts";
 * import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
 *
 * const model = await loadModel("stories260K.bin", { tokenizerPath: "tok512.bin" });
 * // The executor builds a fresh engine with engineFactory when one fails.
 * const engineFactory = () =>
 *   new CpuEngine(model.config, model.weights, { numBlocks: 64, blockSize: 16 });
 * const tokenizer = new Tokenizer(model.tokenizer!);
 * const core = new ServingCore({ engine: engineFactory(), engineFactory, codec: tokenizer });
 * const request = {
 *   // Token ids: the edge (lib/http/generation_request.ts) tokenizes, the core never does.
 *   prompt: tokenizer.encode("Once upon a time"),
 *   maxTokens: 8,
 *   sampling: GREEDY,
 *   stop: [],
 *   priority: "interactive" as const,
 *   requestId: "example",
 * };
 * const types: string[] = [];
 * for await (const ev of core.generate(request, AbortSignal.timeout(30_000))) {
 *   types.push(ev.type);
 *   if (ev.type === "done") assertEquals(ev.usage.completionTokens, 8);
 * }
 * assertEquals([types[0], types.at(-1)], ["started", "done"]);
 * await core.close();
 * ```
 */
export class ServingCore {
  readonly scheduler: SchedulerActor;
  readonly executor: ExecutorActor;
  readonly contextLength: number;
  /** Whether the engine returns hidden states, so embed() works. */
  readonly embeddings: boolean;
  /** The model's hidden size: an embedding's length. */
  readonly hiddenSize: number;
  readonly #codec: TextCodec;
  readonly #clientBuffer: number;
  readonly #grammars: ConstraintCompiler | undefined;
  readonly #now: (() => number) | undefined;
  readonly #loops: Promise<unknown>;
  readonly #steps = new StepTracer();

  /** Links to the request spans of these sequences, for spans of work done for them. */
  requestLinks(seqIds: readonly number[]): Link[] {
    return this.#steps.links(seqIds);
  }

  constructor(opts: ServingCoreOptions) {
    const { engine } = opts;
    const maxInFlight = opts.maxInFlight ?? defaultPipelineDepth(engine.resultsOnHost);
    // An engine with fixed step buffers bounds what the scheduler may put in one step.
    const overrides = {
      lateMasks: engine.lateMasks === true,
      shallowBesideBatch: engine.resultsOnHost === true,
      ...opts.scheduler,
    };
    if (engine.limits) {
      overrides.maxRunning = Math.min(overrides.maxRunning ?? Infinity, engine.limits.maxSeqs);
      overrides.maxBatchTokens = Math.min(
        overrides.maxBatchTokens ?? Infinity,
        engine.limits.maxBatchTokens,
      );
    }
    const config = schedulerConfig({
      numBlocks: engine.kv.numBlocks,
      blockSize: engine.kv.blockSize,
      contextLength: engine.config.contextLength,
      vocabSize: engine.config.vocabSize,
    }, overrides);
    const executorMailbox = createExecutorMailbox(maxInFlight);
    // A configured depth is kept as given; the default one adapts where the engine says how
    // long its readbacks take.
    const adapt = opts.maxInFlight === undefined && engine.readbackLatencyMs !== undefined;
    this.scheduler = new SchedulerActor(config, executorMailbox, {
      maxInFlight,
      ...(adapt
        ? {
          adaptiveDepth: {
            min: DEFAULT_LIMITS.pipelineDepth,
            latencyMs: engine.readbackLatencyMs!,
          },
        }
        : {}),
    });
    const onStep = opts.executor?.onStep;
    this.executor = new ExecutorActor(
      engine,
      opts.engineFactory,
      executorMailbox,
      this.scheduler.mailbox,
      {
        ...opts.executor,
        onStep: (report) => {
          this.#steps.record(report);
          onStep?.(report);
        },
      },
    );
    this.contextLength = engine.config.contextLength;
    this.embeddings = engine.hiddenStates === true;
    this.hiddenSize = engine.config.dim;
    this.#codec = opts.codec;
    this.#clientBuffer = opts.clientBuffer ?? 16;
    this.#grammars = opts.grammars;
    this.#now = opts.now;
    this.#loops = Promise.all([this.scheduler.run(), this.executor.run()]);
  }

  /**
   * Runs one generation, yielding its events until `done` or `error`. Aborting `signal` cancels
   * it (it ends with done("cancelled")); leaving the loop early counts as the client going away
   * and frees its resources at once.
   */
  async *generate(req: GenerationRequest, signal?: AbortSignal): AsyncGenerator<GenerationEvent> {
    const sink = new Channel<GenerationEvent>(this.#clientBuffer);
    // The request actor draws its sequence id here, while the caller's request span is active.
    const seqIds: number[] = [];
    const handle = {
      mailbox: this.scheduler.mailbox,
      nextSeqId: () => {
        const id = this.scheduler.nextSeqId();
        seqIds.push(id);
        this.#steps.bind(id);
        return id;
      },
    };
    const actor = new RequestActor(handle, this.#codec, req, sink, {
      grammars: this.#grammars,
      now: this.#now,
    });
    const onAbort = () => actor.abort();
    signal?.addEventListener("abort", onAbort, { once: true });
    if (signal?.aborted) actor.abort();
    const running = actor.run().finally(() => sink.close());
    try {
      for await (const event of sink) yield event;
    } finally {
      signal?.removeEventListener("abort", onAbort);
      if (!actor.ended) actor.clientGone();
      sink.close();
      await running;
      for (const id of seqIds) this.#steps.unbind(id);
    }
  }

  /**
   * The pooled hidden state of `prompt` (not normalized): a prefill-only sequence beside the
   * generations (actors/embedding.ts). Throws EmbeddingError when it is refused or fails.
   */
  embed(
    prompt: readonly number[],
    pooling: Pooling,
    priority: Priority,
    signal?: AbortSignal,
  ): Promise<Float32Array> {
    return embedPrompt(this.scheduler, { prompt, pooling, priority, dim: this.hiddenSize }, signal);
  }

  /** The scheduler's detailed snapshot. */
  schedulerStats(): SchedulerStats {
    return this.scheduler.stats();
  }

  /** Hashes of prefix-cached blocks, newest last, at most `limit` (a replica's heartbeat). */
  cachedBlockHashes(limit: number): number[] {
    return this.scheduler.cachedBlockHashes(limit);
  }

  /** The snapshot the HTTP layer reports (/metrics, /ready, playground); it runs the steps. */
  stats(): CoreStats & { readonly steps: number; readonly lastBatchSize: number } {
    const s = this.scheduler.stats();
    return {
      running: s.running,
      waiting: s.waiting,
      kvBlocksUsed: s.kvBlocksUsed,
      kvBlocksTotal: s.kvBlocksTotal,
      prefixCacheHitRate: s.prefixHitRate,
      steps: s.steps,
      lastBatchSize: s.lastBatchSize,
      executorHealthy: s.executorHealthy,
      pipelineDepth: this.scheduler.pipelineDepth,
    };
  }

  /** Refuse new generations (they get a "draining" error); running ones go on. */
  drain(): Promise<void> {
    return this.scheduler.mailbox.send({ type: "drain" });
  }

  /** Stops the actors: live generations end with an error, the engine is disposed. */
  async close(): Promise<void> {
    this.scheduler.mailbox.close();
    await this.#loops;
  }
}
