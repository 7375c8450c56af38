import type { KvRequest } from "../engine/kv_budget.ts";
import type { EngineOptions } from "../compose/engine_factory.ts";
import type { OpenServingOptions } from "../compose/open_serving.ts";
import type { Config } from "./config.ts";

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
    "backend" | "limits" | "engineOptions" | "maxInFlight" | "scheduler"
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
    },
  };
}
