import type { ModelConfig } from "./model_config.ts";
import type { Tensor } from "./tensor.ts";
import type { TokenizerData } from "../tokenizer/tokenizer_data.ts";
import type { Pooling } from "./pooling_type.ts";

export type { TokenizerData };

/**
 * One transformer block's tensors. Q and K (with their biases and norm weights) are always in
 * llama2.c's layout, where RoPE rotates adjacent pairs (2i, 2i+1) of each head; loaders undo any
 * other layout a file uses (see RopeStyle in architecture.ts).
 */
export interface LayerWeights {
  readonly attnNorm: Tensor; // [dim]
  readonly wq: Tensor; // [nHeads*headDim, dim]
  readonly wk: Tensor; // [nKvHeads*headDim, dim]
  readonly wv: Tensor; // [nKvHeads*headDim, dim]
  readonly wo: Tensor; // [dim, nHeads*headDim]
  readonly ffnNorm: Tensor; // [dim]
  readonly wGate: Tensor; // [hiddenDim, dim]  (llama2.c w1)
  readonly wDown: Tensor; // [dim, hiddenDim]  (llama2.c w2)
  readonly wUp: Tensor; // [hiddenDim, dim]    (llama2.c w3)
  /** With the qkvBias step: added to q, k and v after their projections. */
  readonly qBias?: Tensor; // [nHeads*headDim]
  readonly kBias?: Tensor; // [nKvHeads*headDim]
  readonly vBias?: Tensor; // [nKvHeads*headDim]
  /** With the qkNorm step: RMSNorm weights applied to every head of q (and of k) before RoPE. */
  readonly qNorm?: Tensor; // [headDim]
  readonly kNorm?: Tensor; // [headDim]
}

export interface ModelWeights {
  readonly tokenEmbedding: Tensor; // [vocabSize, dim]
  readonly layers: readonly LayerWeights[];
  readonly outputNorm: Tensor; // [dim]
  /** Classifier [vocabSize, dim]; the same object as tokenEmbedding when tied. */
  readonly output: Tensor;
}

/** A loaded model: everything an engine and a tokenizer need. */
export interface Model {
  readonly config: ModelConfig;
  readonly weights: ModelWeights;
  /** Absent for a llama2.c checkpoint, which keeps its vocabulary in a separate tokenizer.bin. */
  readonly tokenizer?: TokenizerData;
  /** Jinja chat template from the file's metadata, if any. */
  readonly chatTemplate?: string;
  /** How its embeddings are pooled, where the file says (`<arch>.pooling_type`). */
  readonly pooling?: Pooling;
  /** A reranker's prompt, where the file has one (`tokenizer.chat_template.rerank`). */
  readonly rerankPrompt?: string;
  /** Where it was loaded from, for logs. */
  readonly source: string;
}

/**
 * Bytes of the matrices one decode step reads: every layer's projections and the classifier
 * (the embedding is a lookup; norms and biases are vectors).
 */
export function stepMatrixBytes(weights: ModelWeights): number {
  const layer = (l: LayerWeights) =>
    [l.wq, l.wk, l.wv, l.wo, l.wGate, l.wUp, l.wDown].reduce((n, t) => n + t.data.byteLength, 0);
  return weights.layers.reduce((n, l) => n + layer(l), 0) + weights.output.data.byteLength;
}
