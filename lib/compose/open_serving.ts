/**
 * The one place a serving core is assembled: the engine the backend asks for, its warm-up, the
 * restart factory (the same engine kind rebuilt with the same geometry, limits and options),
 * the lazy grammar service for structured output, and the step/restart metrics. `serve`,
 * `serve` with several models, `generate` and the benchmarks all open their core here, so none
 * can leave out a piece another has (a server without `grammars` answers every
 * response_format request with an error).
 */
import { ServingCore } from "../../actors/core.ts";
import type { ExecutorOptions } from "../../actors/executor.ts";
import type { ConstraintCompiler, TextCodec } from "../../actors/request.ts";
import type { SchedulerConfig } from "../core/scheduler.ts";
import { type Engine, type KvGeometry, stepTokens } from "../engine/engine.ts";
import type { KvPlan, KvRequest } from "../engine/kv_budget.ts";
import { type GrammarService, lazyGrammarService } from "../grammar/grammar_service.ts";
import { GRAMMAR_LIMITS } from "../grammar/grammar_limits.ts";
import type { ServiceMetrics } from "../http/service_metrics.ts";
import type { Model } from "../model/weights.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import {
  type BackendChoice,
  createEngine,
  describeChoice,
  type EngineOptions,
  planKv,
  rebuildBackend,
  type ResolvedBackend,
  type StepLimits,
  warmUp,
} from "./engine_factory.ts";

/** A KV cache planned for a model on its backend, and the model with the context it fits. */
export interface ServingPlan {
  readonly plan: KvPlan;
  readonly kv: KvGeometry;
  /** The model, its context shortened when an automatic cache is too small for the file's. */
  readonly model: Model;
}

/** Plans the KV cache (planKv) and fits the model's context to it. */
export async function planServing(
  model: Model,
  resolved: ResolvedBackend,
  req: Omit<KvRequest, "maxPoolBytes" | "availableMemory">,
  engineOptions: EngineOptions = {},
): Promise<ServingPlan> {
  const plan = await planKv(model, resolved.backend, req, engineOptions, resolved.adapter);
  return {
    plan,
    kv: { numBlocks: plan.numBlocks, blockSize: plan.blockSize },
    model: plan.contextLength === model.config.contextLength
      ? model
      : { ...model, config: { ...model.config, contextLength: plan.contextLength } },
  };
}

export interface OpenServingOptions {
  readonly model: Model;
  /** Encodes and decodes text; its vocabulary is what constrained decoding masks. */
  readonly tokenizer: Tokenizer;
  /** What the user asked for: a restart rebuilds the engine "auto" chose (rebuildBackend). */
  readonly backend: BackendChoice;
  /** resolveBackend's answer for `backend` (default: `backend` as is, no note). */
  readonly resolved?: ResolvedBackend;
  readonly kv: KvGeometry;
  /** What the engine sizes its step buffers for; the scheduler defaults to the same. */
  readonly limits: StepLimits;
  readonly engineOptions?: EngineOptions;
  /** Progress of the first engine's upload to the device. */
  readonly onUpload?: (bytes: number, total: number) => void;
  /**
   * One throw-away step before the core starts (warmUp), with the tokenizer's BOS; a function
   * is called once the engine is built, as the warm-up begins.
   */
  readonly warmUp?: boolean | (() => void);
  /**
   * Builds the engine instead of createEngine, the first and each restart's: a pipeline's head
   * (lib/cli/pipeline_head.ts).
   */
  readonly buildEngine?: () => Promise<{ engine: Engine; description: string }>;
  /** Wraps every engine the core gets, the first and each restart's (fault injection, probes). */
  readonly wrapEngine?: (engine: Engine) => Engine;
  /** The codec the request actors use (default: the tokenizer). */
  readonly codec?: TextCodec;
  /** Constrained decoding (default: the lazy grammar service over the tokenizer's vocabulary). */
  readonly grammars?: ConstraintCompiler;
  /** The default grammar service's budget for one compile (default GRAMMAR_LIMITS.compileMs). */
  readonly grammarCompileMs?: number;
  readonly maxInFlight?: number;
  /** Scheduler overrides; maxRunning and maxBatchTokens default to `limits`. */
  readonly scheduler?: Partial<SchedulerConfig>;
  readonly executor?: ExecutorOptions;
  /** Where each step and each engine restart is counted. */
  readonly metrics?: Pick<
    ServiceMetrics,
    "observeStep" | "observeExecutorRestart" | "observeGrammarRestart"
  >;
}

export interface OpenedServing {
  readonly core: ServingCore;
  /** The first engine as built (before wrapEngine), for its memory and name. */
  readonly engine: Engine;
  /** What was built and why ("auto"'s note included), for the start-up line and /props. */
  readonly description: string;
  /**
   * The default grammar service (the one constrained requests use): `start` starts it now
   * rather than on the first of them, `close` ends its workers with the model. Absent when
   * `grammars` was given.
   */
  readonly grammarEngine?: { start(): Promise<GrammarService>; close(): void };
}

/** Builds the engine, warms it up when asked, and starts a serving core on it. */
export async function openServing(o: OpenServingOptions): Promise<OpenedServing> {
  const resolved = o.resolved ?? { backend: o.backend };
  const engineOptions = o.engineOptions ?? {};
  const built = o.buildEngine ? await o.buildEngine() : await createEngine(
    o.model,
    resolved.backend,
    o.kv,
    o.limits,
    o.onUpload,
    engineOptions,
  );
  const description = describeChoice(built.description, resolved);
  if (o.warmUp) {
    if (typeof o.warmUp === "function") o.warmUp();
    try {
      await warmUp(built.engine, o.tokenizer.bosId);
    } catch (e) {
      built.engine.dispose();
      throw e;
    }
  }
  const wrap = o.wrapEngine ?? ((e: Engine) => e);
  const rebuild = rebuildBackend(description, o.backend);
  const { metrics, executor } = o;
  const lazy = o.grammars === undefined
    ? lazyGrammarService(o.tokenizer, o.model.config.vocabSize, {
      ...(o.grammarCompileMs === undefined
        ? {}
        : { limits: { ...GRAMMAR_LIMITS, compileMs: o.grammarCompileMs } }),
      onRestart: (reason, why) => {
        console.error(`grammar worker ended (${reason}): ${why}`);
        metrics?.observeGrammarRestart(reason);
      },
    })
    : undefined;
  const core = new ServingCore({
    engine: wrap(built.engine),
    engineFactory: async () =>
      wrap(
        (o.buildEngine
          ? await o.buildEngine()
          : await createEngine(o.model, rebuild, o.kv, o.limits, undefined, engineOptions)).engine,
      ),
    codec: o.codec ?? o.tokenizer,
    grammars: o.grammars ?? lazy!,
    ...(o.maxInFlight === undefined ? {} : { maxInFlight: o.maxInFlight }),
    scheduler: {
      maxBatchTokens: o.limits.maxBatchTokens,
      maxRunning: o.limits.maxSeqs,
      ...o.scheduler,
    },
    executor: metrics === undefined ? executor : {
      ...executor,
      // Restarts are counted by the executor, not from failed steps: every step already
      // handed to a dead engine fails too.
      onRestart: (n) => {
        metrics.observeExecutorRestart();
        executor?.onRestart?.(n);
      },
      onStep: (r) => {
        executor?.onStep?.(r);
        if (r.error !== undefined) return;
        const tokens = stepTokens(r.plan);
        metrics.observeStep({ durationMs: r.durationMs, batchSize: r.plan.seqs.length, tokens });
      },
    },
  });
  return {
    core,
    engine: built.engine,
    description,
    ...(lazy === undefined ? {} : { grammarEngine: { start: lazy.service, close: lazy.close } }),
  };
}
