import { type Architecture, NO_EXTRA_STEPS } from "./architecture.ts";

/**
 * Llama 1/2/3.x, TinyLlama, SmolLM and Mistral 7B/Nemo files (llama.cpp writes them all as
 * `llama`): adjacent-pair RoPE, optional Llama 3.1 frequency factors, optional key_length.
 */
export const LLAMA: Architecture = {
  name: "llama",
  rope: "norm",
  steps: NO_EXTRA_STEPS,
  headDimFromKeyLength: true,
  ropeFreqFactors: true,
  tiedClassifier: true,
};

/** Qwen2 / Qwen2.5: biases on q, k and v; Hugging Face (NEOX) RoPE pairing. */
export const QWEN2: Architecture = {
  name: "qwen2",
  rope: "neox",
  steps: { qkvBias: true, qkNorm: false },
  headDimFromKeyLength: true,
  ropeFreqFactors: false,
  tiedClassifier: true,
};

/** Qwen3 (dense): per-head RMSNorm of q and k before RoPE, no biases, head size from key_length. */
export const QWEN3: Architecture = {
  name: "qwen3",
  rope: "neox",
  steps: { qkvBias: false, qkNorm: true },
  headDimFromKeyLength: true,
  ropeFreqFactors: false,
  tiedClassifier: true,
};

/** Every architecture the loader accepts, by `general.architecture`. */
export const ARCHITECTURES: ReadonlyMap<string, Architecture> = new Map(
  [LLAMA, QWEN2, QWEN3].map((a) => [a.name, a]),
);
