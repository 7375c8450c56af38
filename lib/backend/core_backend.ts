import type { ServingCore } from "../../actors/core.ts";
import type {
  CoreStats,
  GenerationBackend,
  GenerationEvent,
  GenerationRequest,
  SamplingDefaults,
} from "../core/generation.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import { PromptTokens } from "./prompt_tokens.ts";
import { DelegatedText } from "./delegated_text.ts";
import type { Embedder } from "../core/embedder.ts";
import { DEFAULT_EMBD_NORMALIZE, normalizeEmbedding } from "../engine/embedding_norm.ts";
import type { Model } from "../model/weights.ts";
import type { Pooling } from "../engine/pooling.ts";

/** How the backend's embeddings are pooled and normalized (the GGUF's or the settings'). */
export interface EmbeddingSettings {
  readonly pooling: Pooling;
  /** llama-server's --embd-normalize (embedding_norm.ts). */
  readonly normalize: number;
}

/**
 * Presents the serving core to the HTTP layer: requests go to it as they are (ids, built by
 * lib/http/generation_request.ts); text is encoded as PromptTokens says.
 */
export class CoreBackend extends DelegatedText<PromptTokens> implements GenerationBackend {
  readonly contextLength: number;
  readonly bosToken: string;
  readonly eosToken: string;
  readonly vocabSize: number;
  readonly specialTokens: readonly string[];
  readonly embedder?: Embedder;

  constructor(
    readonly modelName: string,
    private readonly core: ServingCore,
    tokenizer: Tokenizer,
    readonly chatTemplate?: string,
    readonly samplingDefaults?: SamplingDefaults,
    embedding?: EmbeddingSettings,
    /** GenerationBackend.rerankPrompt. */
    readonly rerankPrompt?: string,
  ) {
    super(new PromptTokens(tokenizer));
    this.contextLength = core.contextLength;
    this.bosToken = this.text.bosToken;
    this.eosToken = this.text.eosToken;
    this.vocabSize = this.text.vocabSize;
    this.specialTokens = this.text.specialTokens;
    if (core.embeddings && embedding) this.embedder = coreEmbedder(core, embedding);
  }

  generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent> {
    return this.core.generate(req, signal);
  }

  minTokens(text: string): number {
    return this.text.minTokens(text);
  }

  stats(): CoreStats {
    return this.core.stats();
  }
}

/**
 * A model's embedding settings: the pooling its file names, else mean (what most decoder
 * embedding models use), normalized as llama-server's default (Euclidean).
 */
export function embeddingSettings(
  model: Pick<Model, "pooling">,
  given: Partial<EmbeddingSettings> = {},
): EmbeddingSettings {
  return {
    pooling: given.pooling ?? model.pooling ?? "mean",
    normalize: given.normalize ?? DEFAULT_EMBD_NORMALIZE,
  };
}

/** The core's embeddings, pooled as `settings` say (interactive unless asked otherwise). */
function coreEmbedder(core: ServingCore, settings: EmbeddingSettings): Embedder {
  const { pooling, normalize } = settings;
  return {
    pooling,
    normalize,
    dimensions: core.hiddenSize,
    async embed(ids, signal, priority = "interactive") {
      return normalizeEmbedding(await core.embed(ids, pooling, priority, signal), normalize);
    },
  };
}
