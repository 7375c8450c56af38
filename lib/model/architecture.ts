/**
 * What a GGUF architecture is made of, as data: which tensors a block has, which of them may be
 * absent, how the file orders each head's dimensions for RoPE, and where the head size comes
 * from. The loader (gguf_model.ts) reads a file through one of these; the engines see only the
 * result (a ModelConfig whose `steps` say which optional forward steps run, and LayerWeights
 * holding their tensors). Adding an architecture that only recombines these steps is one entry
 * in architectures.ts; one that needs a new step (Gemma's GELU, Phi's partial rotary + dense
 * MLP) adds the step here and to both engines once.
 */

/**
 * How the file's Q/K rows pair dimensions for RoPE, in llama.cpp's terms. "norm": adjacent
 * pairs (2i, 2i+1) within each head, the layout of llama2.c and of llama.cpp's `llama` files
 * (its Hugging Face converter permutes Llama's Q/K into it). "neox": pairs (i, i + ropeDim/2),
 * the Hugging Face layout, which llama.cpp keeps for qwen2/qwen3. The engines implement only
 * "norm": the loader reorders a "neox" file's Q/K rows (and their biases and norm weights) into
 * it, which leaves every attention score unchanged since q and k are permuted alike.
 */
export type RopeStyle = "norm" | "neox";

/** Optional forward steps an architecture switches on (both engines implement each once). */
export interface ForwardSteps {
  /** q, k and v projections add a bias (attn_q.bias, attn_k.bias, attn_v.bias). */
  readonly qkvBias: boolean;
  /** Each head of q and of k is RMS-normalised with its own weights (attn_q_norm, attn_k_norm) before RoPE. */
  readonly qkNorm: boolean;
}

export const NO_EXTRA_STEPS: ForwardSteps = { qkvBias: false, qkNorm: false };

export interface Architecture {
  /** `general.architecture`, also the prefix of its hyper-parameter keys (`qwen2.block_count`). */
  readonly name: string;
  readonly rope: RopeStyle;
  readonly steps: ForwardSteps;
  /**
   * Whether `<arch>.attention.key_length` may set the head size apart from embedding ÷ heads
   * (Qwen3: 128 against 1024 ÷ 16 = 64; Mistral Nemo: 128 against 5120 ÷ 32 = 160).
   */
  readonly headDimFromKeyLength: boolean;
  /** Whether `rope_freqs.weight` (per-pair frequency divisors, Llama 3.1 scaling) may be present. */
  readonly ropeFreqFactors: boolean;
  /** Whether `output.weight` may be absent, the classifier then being the token embedding. */
  readonly tiedClassifier: boolean;
}

/** The GGUF tensor names of one block's weights, by the role they play (LayerWeights keys). */
export const LAYER_TENSORS = {
  attnNorm: "attn_norm.weight",
  wq: "attn_q.weight",
  wk: "attn_k.weight",
  wv: "attn_v.weight",
  wo: "attn_output.weight",
  ffnNorm: "ffn_norm.weight",
  wGate: "ffn_gate.weight",
  wDown: "ffn_down.weight",
  wUp: "ffn_up.weight",
} as const;

/** Tensors of the optional steps, by step. */
export const STEP_TENSORS = {
  qkvBias: { qBias: "attn_q.bias", kBias: "attn_k.bias", vBias: "attn_v.bias" },
  qkNorm: { qNorm: "attn_q_norm.weight", kNorm: "attn_k_norm.weight" },
} as const;

/** Model-level tensors. */
export const MODEL_TENSORS = {
  tokenEmbedding: "token_embd.weight",
  outputNorm: "output_norm.weight",
  output: "output.weight",
  ropeFreqs: "rope_freqs.weight",
} as const;
