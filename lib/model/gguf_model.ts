import type { GgufFile, GgufValue } from "./gguf.ts";
import type { ModelConfig } from "./model_config.ts";
import type { Tensor } from "./tensor.ts";
import { ggufTokenizerData } from "./gguf_tokenizer.ts";
import type { LayerWeights, Model, ModelWeights } from "./weights.ts";

const SUPPORTED_ARCHITECTURES = ["llama"];

/**
 * Turns a parsed GGUF into a Model. Tensors are the GGUF's own (views of its data); nothing is
 * copied.
 *
 * Q and K need no un-permuting: llama.cpp runs the llama architecture with RoPE on adjacent
 * pairs (its "normal" RoPE), the layout of llama2.c. Its Hugging Face converter permutes Q/K
 * only to undo Hugging Face's own half-split layout, and its llama2.c converter copies them as
 * they are (checked: stories260K.gguf's attn_q/attn_k equal stories260K.bin's wq/wk exactly).
 */
export function ggufToModel(gguf: GgufFile, source: string): Model {
  const fail = (what: string): never => {
    throw new Error(`Cannot load GGUF ${source}: ${what}`);
  };
  const meta = (key: string): GgufValue | undefined => gguf.metadata.get(key)?.value;

  const arch = meta("general.architecture");
  if (arch === undefined) fail("metadata 'general.architecture' is missing");
  if (typeof arch !== "string" || !SUPPORTED_ARCHITECTURES.includes(arch)) {
    fail(
      `architecture '${String(arch)}' is not supported; supported: ${
        SUPPORTED_ARCHITECTURES.join(", ")
      }`,
    );
  }

  const num = (key: string, fallback?: number): number => {
    const v = meta(key);
    if (v === undefined) {
      if (fallback !== undefined) return fallback;
      return fail(`metadata '${key}' is missing`);
    }
    if (typeof v !== "number" || !Number.isFinite(v)) {
      return fail(`metadata '${key}' must be a number, received ${describe(v)}`);
    }
    return v;
  };
  const positiveInt = (key: string, fallback?: number): number => {
    const v = num(key, fallback);
    if (!Number.isInteger(v) || v <= 0) {
      fail(`metadata '${key}' must be a positive integer, received ${v}`);
    }
    return v;
  };

  const dim = positiveInt("llama.embedding_length");
  const nHeads = positiveInt("llama.attention.head_count");
  const nKvHeads = positiveInt("llama.attention.head_count_kv", nHeads);
  if (dim % nHeads !== 0 || nHeads % nKvHeads !== 0) {
    fail(
      `embedding_length ${dim} must divide by head_count ${nHeads}, and head_count by head_count_kv ${nKvHeads}`,
    );
  }
  const headDim = dim / nHeads;
  const ropeDim = positiveInt("llama.rope.dimension_count", headDim);
  if (ropeDim > headDim || ropeDim % 2 !== 0) {
    fail(
      `llama.rope.dimension_count must be even and at most the head size ${headDim}, received ${ropeDim}`,
    );
  }

  const tokenizer = ggufTokenizerData(gguf.metadata, source);
  const tensor = (name: string): Tensor =>
    gguf.tensors.get(name) ?? fail(`tensor '${name}' is missing`);
  const tokenEmbedding = tensor("token_embd.weight");
  const vocabSize = tokenizer?.tokens.length ?? tokenEmbedding.shape[0] ?? 0;

  const config: ModelConfig = {
    architecture: "llama",
    dim,
    hiddenDim: positiveInt("llama.feed_forward_length"),
    nLayers: positiveInt("llama.block_count"),
    nHeads,
    nKvHeads,
    headDim,
    vocabSize,
    contextLength: positiveInt("llama.context_length"),
    ropeTheta: num("llama.rope.freq_base", 10000),
    ropeDim,
    rmsEps: num("llama.attention.layer_norm_rms_epsilon", 1e-5),
  };

  const shaped = (name: string, shape: number[]): Tensor => {
    const t = tensor(name);
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      fail(`tensor '${name}' has shape [${t.shape.join(", ")}], expected [${shape.join(", ")}]`);
    }
    return t;
  };
  const { hiddenDim, nLayers } = config;
  const qDim = nHeads * headDim;
  const kvDim = nKvHeads * headDim;
  const layers: LayerWeights[] = Array.from({ length: nLayers }, (_, l) => ({
    attnNorm: shaped(`blk.${l}.attn_norm.weight`, [dim]),
    wq: shaped(`blk.${l}.attn_q.weight`, [qDim, dim]),
    wk: shaped(`blk.${l}.attn_k.weight`, [kvDim, dim]),
    wv: shaped(`blk.${l}.attn_v.weight`, [kvDim, dim]),
    wo: shaped(`blk.${l}.attn_output.weight`, [dim, qDim]),
    ffnNorm: shaped(`blk.${l}.ffn_norm.weight`, [dim]),
    wGate: shaped(`blk.${l}.ffn_gate.weight`, [hiddenDim, dim]),
    wDown: shaped(`blk.${l}.ffn_down.weight`, [dim, hiddenDim]),
    wUp: shaped(`blk.${l}.ffn_up.weight`, [hiddenDim, dim]),
  }));
  const weights: ModelWeights = {
    tokenEmbedding: shaped("token_embd.weight", [vocabSize, dim]),
    layers,
    outputNorm: shaped("output_norm.weight", [dim]),
    // Files of tied models may omit the classifier; it is then the embedding table itself.
    output: gguf.tensors.has("output.weight")
      ? shaped("output.weight", [vocabSize, dim])
      : tokenEmbedding,
  };

  const chatTemplate = meta("tokenizer.chat_template");
  return {
    config,
    weights,
    ...(tokenizer ? { tokenizer } : {}),
    ...(typeof chatTemplate === "string" ? { chatTemplate } : {}),
    source,
  };
}

function describe(v: GgufValue | undefined): string {
  if (v === undefined) return "nothing";
  if (typeof v === "string") return `'${v}'`;
  if (Array.isArray(v)) return `an array of ${v.length}`;
  if (ArrayBuffer.isView(v)) return `a ${v.constructor.name} of ${v.length}`;
  return `${typeof v} ${String(v)}`;
}
