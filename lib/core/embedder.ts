import type { Pooling } from "../engine/pooling.ts";
import type { GenerationErrorCode, Priority } from "./generation.ts";

/**
 * What /v1/embeddings needs of a backend whose engine returns hidden states: one input's ids
 * in, its pooled and normalized vector out, computed by the shared scheduler beside the
 * generations.
 */
export interface Embedder {
  readonly pooling: Pooling;
  /** Length of every vector: the model's hidden size. */
  readonly dimensions: number;
  /** llama-server's --embd-normalize value the vectors are normalized with. */
  readonly normalize: number;
  /** Throws EmbeddingError when the scheduler refuses or fails it. */
  embed(ids: readonly number[], signal?: AbortSignal, priority?: Priority): Promise<Float32Array>;
}

/** Why an embedding was not computed, with a generation's error code (and so its HTTP status). */
export class EmbeddingError extends Error {
  constructor(readonly code: GenerationErrorCode | "cancelled", message: string) {
    super(message);
    this.name = "EmbeddingError";
  }
}

/**
 * What the cache for similar questions embeds a question with: a text in, its vector out. The
 * served model's own embedder over its tokenizer, or another model's (--similar-cache-model).
 */
export interface TextEmbedder {
  /** Length of every vector. */
  readonly dimensions: number;
  embed(text: string, signal?: AbortSignal): Promise<Float32Array>;
}

/** `embedder` over `tokenize` (with the special tokens a prompt gets, as /v1/embeddings reads a text). */
export function textEmbedder(
  embedder: Embedder,
  tokenize: (text: string, opts: { bos: boolean; special: boolean }) => number[],
): TextEmbedder {
  return {
    dimensions: embedder.dimensions,
    embed: (text, signal) => embedder.embed(tokenize(text, { bos: true, special: false }), signal),
  };
}
