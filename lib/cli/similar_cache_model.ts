/**
 * `--similar-cache-model`: the model the cache for similar questions embeds questions with,
 * instead of the served model's own hidden states. It runs on the CPU engine beside the served
 * model (its own small KV cache and scheduler), pooled as its file says and normalized as the
 * server's embeddings are: a question's vector is the one that model's /v1/embeddings gives.
 */
import type { Config } from "./config.ts";
import { openModel } from "./open_model.ts";
import { modelAllocator, modelPlacement } from "../compose/engine_factory.ts";
import { openServing, planServing } from "../compose/open_serving.ts";
import { CoreBackend, embeddingSettings } from "../backend/core_backend.ts";
import { type TextEmbedder, textEmbedder } from "../core/embedder.ts";
import { modelStem } from "../source/model_source.ts";

/**
 * Its KV cache and limits: questions are short and embedded one request at a time, so a few
 * sequences of a shortened context are plenty (a longer question fails to embed and is
 * generated as a miss, logged).
 */
export const SIMILAR_MODEL_LIMITS = {
  kvMemory: 16 * 1024 * 1024,
  maxRunning: 4,
  maxBatchTokens: 512,
} as const;

export interface SimilarCacheModel {
  readonly embedder: TextEmbedder;
  /** Its file and engine, for the start-up lines. */
  readonly description: string;
  close(): Promise<void>;
}

/** Opens `--similar-cache-model` on the CPU engine; throws naming the flag when it cannot. */
export async function openSimilarCacheModel(
  config: Pick<Config, "modelsDir" | "blockSize" | "threads" | "embdNormalize">,
  spec: string,
): Promise<SimilarCacheModel> {
  try {
    const { source, model, tokenizer } = await openModel(spec, {
      modelsDir: config.modelsDir,
      purpose: "embed questions with",
      allocate: modelAllocator("cpu"),
      placeTensors: modelPlacement("cpu", SIMILAR_MODEL_LIMITS.kvMemory),
    });
    const engineOptions = config.threads === undefined ? {} : { threads: config.threads };
    const planned = await planServing(model, { backend: "cpu" }, {
      blockSize: config.blockSize,
      kvMemory: SIMILAR_MODEL_LIMITS.kvMemory,
      maxRunning: SIMILAR_MODEL_LIMITS.maxRunning,
    }, engineOptions);
    const { core, description } = await openServing({
      model: planned.model,
      tokenizer,
      backend: "cpu",
      kv: planned.kv,
      limits: {
        maxBatchTokens: SIMILAR_MODEL_LIMITS.maxBatchTokens,
        maxSeqs: SIMILAR_MODEL_LIMITS.maxRunning,
      },
      engineOptions,
      warmUp: true,
    });
    const backend = new CoreBackend(
      modelStem(source.modelPath),
      core,
      tokenizer,
      undefined,
      undefined,
      embeddingSettings(model, { normalize: config.embdNormalize }),
    );
    const embedder = backend.embedder;
    if (embedder === undefined) {
      await core.close();
      throw new Error("its engine returns no hidden states");
    }
    return {
      embedder: textEmbedder(embedder, (text, opts) => backend.tokenize(text, opts)),
      description: `${source.modelPath} on ${description}, ${embedder.pooling} pooling, ` +
        `${embedder.dimensions} dimensions, context ${planned.model.config.contextLength}`,
      close: () => core.close(),
    };
  } catch (e) {
    throw new Error(
      `Cannot use --similar-cache-model ${JSON.stringify(spec)}: ${
        e instanceof Error ? e.message : e
      }`,
    );
  }
}
