import type { ServingCore } from "../../actors/core.ts";
import type { CoreBackend } from "../backend/core_backend.ts";
import type { TokenizerData } from "../tokenizer/tokenizer_data.ts";
import type { ReplicaSource } from "./replica.ts";
import { tokenizerToWire } from "./tokenizer_wire.ts";

/**
 * What a replica tells routers about one serving core: its model's facts and vocabulary, and
 * the scheduler's load against the configured limits. The one builder for `serve --nats` and
 * for each model of a server of several models.
 */
export function coreReplicaSource(o: {
  readonly backend: CoreBackend;
  readonly core: ServingCore;
  readonly tokenizer: TokenizerData;
  readonly blockSize: number;
  /** The name routers know it by (default the backend's). */
  readonly modelName?: string;
  /** Further names it is served by (a server of one model's other --served-model-name). */
  readonly aliases?: readonly string[];
  /** The file's identity; without it routers go by the name alone. */
  readonly modelId: string | undefined;
  readonly limits: { readonly maxRunning: number; readonly maxWaiting: number };
}): ReplicaSource {
  const { backend, core } = o;
  const e = backend.embedder;
  return {
    backend,
    ...(o.aliases === undefined ? {} : { aliases: o.aliases }),
    blockSize: o.blockSize,
    info: {
      modelName: o.modelName ?? backend.modelName,
      modelId: o.modelId,
      contextLength: backend.contextLength,
      vocabSize: backend.vocabSize,
      bosToken: backend.bosToken,
      eosToken: backend.eosToken,
      chatTemplate: backend.chatTemplate,
      ...(backend.rerankPrompt === undefined ? {} : { rerankPrompt: backend.rerankPrompt }),
      ...(e === undefined
        ? {}
        : { embedding: { pooling: e.pooling, normalize: e.normalize, dimensions: e.dimensions } }),
      tokenizer: tokenizerToWire(o.tokenizer),
    },
    load: () => {
      const s = core.schedulerStats();
      return {
        running: s.running,
        waiting: s.waiting,
        maxRunning: o.limits.maxRunning,
        maxWaiting: o.limits.maxWaiting,
        kvBlocksUsed: s.kvBlocksUsed,
        kvBlocksTotal: s.kvBlocksTotal,
        prefixQueryTokens: s.prefixQueryTokens,
        prefixHitTokens: s.prefixHitTokens,
      };
    },
    cachedBlockHashes: (limit) => core.cachedBlockHashes(limit),
  };
}
