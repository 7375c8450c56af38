import type { KvRequest } from "../engine/kv_budget.ts";
import type { EngineOptions } from "../compose/engine_factory.ts";
import type { OpenServingOptions } from "../compose/open_serving.ts";
import type { Config } from "./config.ts";
import type { ServingCore } from "../../actors/core.ts";
import type { GenerationBackend, SamplingDefaults } from "../core/generation.ts";
import type { Model } from "../model/weights.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import { CachedBackend } from "../backend/cached_backend.ts";
import type { SharedResultStore } from "../core/shared_result_store.ts";
import { CoreBackend, embeddingSettings } from "../backend/core_backend.ts";
import type { AppOptions } from "../http/app.ts";
import type { TextEmbedder } from "../core/embedder.ts";

/**
 * What a server's configuration asks of each serving core it opens: the engine's options, the
 * KV request to plan, and the core's backend, step limits, pipeline and queue. `serve` and the
 * several-models server read them from here, so a setting reaches both or neither.
 */
export function servingSettings(c: Config): {
  readonly engineOptions: EngineOptions;
  readonly kvRequest: Omit<KvRequest, "maxPoolBytes" | "availableMemory">;
  readonly core: Pick<
    OpenServingOptions,
    "backend" | "limits" | "engineOptions" | "maxInFlight" | "scheduler" | "grammarCompileMs"
  >;
} {
  const engineOptions: EngineOptions = {
    ...(c.kvDtype === undefined ? {} : { kvDtype: c.kvDtype }),
    ...(c.threads === undefined ? {} : { threads: c.threads }),
  };
  return {
    engineOptions,
    kvRequest: {
      blockSize: c.blockSize,
      maxRunning: c.maxRunning,
      ...(c.kvMemory === undefined ? {} : { kvMemory: c.kvMemory }),
      // --context-length given: a --kv-memory that cannot hold it is an error, not a shortening.
      ...(c.contextLength === undefined ? {} : { contextFixed: true }),
    },
    core: {
      backend: c.backend,
      limits: { maxBatchTokens: c.maxBatchTokens, maxSeqs: c.maxRunning },
      engineOptions,
      ...(c.pipelineDepth === undefined ? {} : { maxInFlight: c.pipelineDepth }),
      scheduler: { maxWaiting: c.maxWaiting },
      grammarCompileMs: c.grammarCompileTimeout,
    },
  };
}

/**
 * The backend a server's configuration asks for over its core: the result cache where
 * --result-cache is on, with the cache for similar questions where --similar-cache is too; and
 * the embeddings' pooling and normalization; `shared` (a replica's, see sharedResultStore())
 * as the result cache's second level. Throws where --similar-cache is given without the
 * result cache that holds the answers it replays.
 */
export function servedBackend(
  c: Config,
  core: CoreBackendParts,
  shared?: SharedResultStore,
  /** What the cache for similar questions embeds with (--similar-cache-model, opened). */
  questions?: TextEmbedder,
): { readonly coreBackend: CoreBackend; readonly backend: GenerationBackend } {
  const embedding = embeddingSettings(core.model, {
    ...(c.pooling === undefined ? {} : { pooling: c.pooling }),
    normalize: c.embdNormalize,
  });
  const inner = new CoreBackend(
    core.name,
    core.core,
    core.tokenizer,
    core.chatTemplate,
    core.sampling,
    embedding,
    c.rerankPrompt ?? core.model.rerankPrompt,
  );
  if (c.similarCache !== undefined && c.resultCache === 0) {
    throw new Error(
      `--similar-cache needs --result-cache, which holds the answers it replays; received --similar-cache ${c.similarCache} and --result-cache 0`,
    );
  }
  if (c.similarCacheModel !== undefined && c.similarCache === undefined) {
    throw new Error(
      `--similar-cache-model needs --similar-cache, the threshold of the cache it embeds questions for; received --similar-cache-model ${
        JSON.stringify(c.similarCacheModel)
      } alone`,
    );
  }
  if (c.resultCache === 0) return { coreBackend: inner, backend: inner };
  const similar = c.similarCache === undefined ? undefined : {
    threshold: c.similarCache,
    capacityBytes: c.similarCacheMemory,
    ...(questions === undefined ? {} : { embedder: questions }),
  };
  return {
    coreBackend: inner,
    backend: new CachedBackend(inner, c.resultCache, similar, shared),
  };
}

/** What a served model's CoreBackend is made of. */
export interface CoreBackendParts {
  readonly name: string;
  readonly core: ServingCore;
  readonly tokenizer: Tokenizer;
  readonly model: Pick<Model, "pooling" | "rerankPrompt">;
  readonly chatTemplate?: string;
  readonly sampling?: SamplingDefaults;
}

/**
 * The app of one served model: what it takes from the configuration (keys, origins, drain,
 * and the limits /props reports) beside what is its own. `serve` and the several-models server
 * build each model's app from here.
 */
export function modelAppOptions(
  c: Config,
  own: Pick<AppOptions, "backend" | "metrics" | "servedModelNames" | "requestLog" | "extend"> & {
    readonly modelPath: string;
    /** The engine in words. */
    readonly description: string;
    readonly kvBlocks: number;
  },
): AppOptions {
  return {
    ...(own.extend ? { extend: own.extend } : {}),
    backend: own.backend,
    metrics: own.metrics,
    apiKeys: c.apiKey,
    cacheScope: c.cacheScope,
    corsOrigins: c.corsOrigin,
    allowedHosts: c.allowedHost,
    drainTimeoutMs: c.drainTimeout * 1000,
    servedModelNames: own.servedModelNames,
    metricsPublic: c.metricsPublic,
    requestLog: own.requestLog,
    props: {
      modelPath: own.modelPath,
      backend: own.description,
      maxRunning: c.maxRunning,
      maxWaiting: c.maxWaiting,
      maxBatchTokens: c.maxBatchTokens,
      kvBlocks: own.kvBlocks,
      blockSize: c.blockSize,
      resultCacheBytes: c.resultCache,
    },
  };
}
