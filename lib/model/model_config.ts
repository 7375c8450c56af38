/** Hyper-parameters of a Llama-architecture model, whatever file it came from. */
export interface ModelConfig {
  readonly architecture: "llama";
  /** Embedding width. */
  readonly dim: number;
  /** Feed-forward (SwiGLU) inner width. */
  readonly hiddenDim: number;
  readonly nLayers: number;
  readonly nHeads: number;
  /** Key/value heads; fewer than nHeads means grouped-query attention. */
  readonly nKvHeads: number;
  readonly headDim: number;
  readonly vocabSize: number;
  /** Longest sequence (prompt + completion) the model accepts. */
  readonly contextLength: number;
  readonly ropeTheta: number;
  /** Leading dimensions of each head that RoPE rotates (usually headDim). */
  readonly ropeDim: number;
  readonly rmsEps: number;
}
