import type { Architecture } from "./architecture.ts";
import { LAYER_TENSORS, MODEL_TENSORS, STEP_TENSORS } from "./architecture.ts";
import { ARCHITECTURES } from "./architectures.ts";
import { dequantize } from "./dequantize.ts";
import {
  describeGgufValue,
  type GgufFile,
  type GgufHeader,
  type GgufValue,
  SUPPORTED_TENSOR_TYPE_NAMES,
  unsupportedTensorTypes,
} from "./gguf.ts";
import { LLAMA_DEFAULTS, type ModelConfig } from "./model_config.ts";
import { neoxToNormOrder, permuteRows } from "./rope_layout.ts";
import type { Tensor } from "./tensor.ts";
import { ggufTokenizerData, tokenizerBlocker } from "./gguf_tokenizer.ts";
import type { LayerWeights, Model, ModelWeights } from "./weights.ts";
import { poolingOfCode } from "./pooling_type.ts";

/**
 * Everything about a GGUF header that keeps this project from running the file, each named
 * with what was found and what is supported: the architecture, the tokenizer, RoPE scaling,
 * and every unsupported tensor type with its tensor count. Empty when nothing blocks it.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { GgufValueType, readGgufHeader } from "./gguf.ts";
 *
 * const header = await readGgufHeader("stories260K.gguf");
 * assertEquals(ggufBlockers(header), []);
 * // The same header naming an architecture this project does not run:
 * const metadata = new Map(header.metadata)
 *   .set("general.architecture", { type: GgufValueType.STRING, value: "gemma2" });
 * assertEquals(ggufBlockers({ ...header, metadata }), [
 *   "architecture 'gemma2' is not supported (supported: llama, qwen2, qwen3)",
 * ]);
 * ```
 */
export function ggufBlockers(header: GgufHeader): string[] {
  const meta = (key: string): GgufValue | undefined => header.metadata.get(key)?.value;
  const blockers: string[] = [];
  const arch = meta("general.architecture");
  if (arch === undefined) {
    blockers.push("metadata 'general.architecture' is missing");
  } else if (typeof arch !== "string" || !ARCHITECTURES.has(arch)) {
    blockers.push(
      `architecture '${String(arch)}' is not supported (supported: ${
        [...ARCHITECTURES.keys()].join(", ")
      })`,
    );
  } else {
    const scaling = meta(`${arch}.rope.scaling.type`);
    if (scaling !== undefined && scaling !== "none") {
      blockers.push(
        `RoPE scaling '${
          String(scaling)
        }' (${arch}.rope.scaling.type) is not supported (supported: none, and Llama 3 frequency factors in rope_freqs.weight)`,
      );
    }
  }
  const tokenizer = tokenizerBlocker(header.metadata);
  if (tokenizer) blockers.push(tokenizer);
  for (const u of unsupportedTensorTypes(header)) {
    blockers.push(
      `tensor type ${u.name} (ggml type ${u.typeId}) in ${u.count} tensor${
        u.count === 1 ? "" : "s"
      } (first: ${u.example}) is not supported (supported: ${
        SUPPORTED_TENSOR_TYPE_NAMES.join(", ")
      })`,
    );
  }
  return blockers;
}

/** Throws one error listing every blocker of the file, when there is any. */
export function assertLoadable(header: GgufHeader, source: string): void {
  const blockers = ggufBlockers(header);
  if (blockers.length === 0) return;
  throw new Error(
    `Cannot load GGUF ${source}: ${
      blockers.length === 1
        ? blockers[0]
        : `${blockers.length} problems:\n  - ${blockers.join("\n  - ")}`
    }`,
  );
}

/**
 * Turns a parsed GGUF into a Model, reading it through its architecture's description
 * (architectures.ts): hyper-parameters under `<arch>.*`, each block's tensors, those of the
 * optional steps the architecture switches on, and the tied classifier. Tensors are the GGUF's
 * own (views of its data) except Q/K of a "neox" architecture, whose rows are reordered into
 * the adjacent-pair layout the engines implement (see RopeStyle). A tensor the architecture
 * does not use is refused rather than ignored: it would change the output.
 *
 * llama files need no reordering: llama.cpp runs the llama architecture with RoPE on adjacent
 * pairs (its "normal" RoPE), the layout of llama2.c. Its Hugging Face converter permutes Q/K
 * only to undo Hugging Face's own half-split layout, and its llama2.c converter copies them as
 * they are (checked: stories260K.gguf's attn_q/attn_k equal stories260K.bin's wq/wk exactly).
 */
export function ggufToModel(gguf: GgufFile, source: string): Model {
  const fail = (what: string): never => {
    throw new Error(`Cannot load GGUF ${source}: ${what}`);
  };
  assertLoadable(gguf, source);
  const meta = (key: string): GgufValue | undefined => gguf.metadata.get(key)?.value;
  const arch: Architecture = ARCHITECTURES.get(meta("general.architecture") as string)!;
  const key = (name: string) => `${arch.name}.${name}`;

  const num = (name: string, fallback?: number): number => {
    const v = meta(key(name));
    if (v === undefined) {
      if (fallback !== undefined) return fallback;
      return fail(`metadata '${key(name)}' is missing`);
    }
    if (typeof v !== "number" || !Number.isFinite(v)) {
      return fail(`metadata '${key(name)}' must be a number, received ${describeGgufValue(v)}`);
    }
    return v;
  };
  const positiveInt = (name: string, fallback?: number): number => {
    const v = num(name, fallback);
    if (!Number.isInteger(v) || v <= 0) {
      fail(`metadata '${key(name)}' must be a positive integer, received ${v}`);
    }
    return v;
  };

  const dim = positiveInt("embedding_length");
  const nHeads = positiveInt("attention.head_count");
  const nKvHeads = positiveInt("attention.head_count_kv", nHeads);
  if (nHeads % nKvHeads !== 0) {
    fail(`head_count ${nHeads} must be a multiple of head_count_kv ${nKvHeads}`);
  }
  const keyLength = arch.headDimFromKeyLength ? meta(key("attention.key_length")) : undefined;
  if (keyLength === undefined && dim % nHeads !== 0) {
    fail(
      `embedding_length ${dim} must divide by head_count ${nHeads} when '${
        key("attention.key_length")
      }' does not give the head size`,
    );
  }
  const headDim = keyLength === undefined ? dim / nHeads : positiveInt("attention.key_length");
  const valueLength = positiveInt("attention.value_length", headDim);
  if (valueLength !== headDim) {
    fail(
      `value heads of ${valueLength} (${
        key("attention.value_length")
      }) differ from key heads of ${headDim}; only equal sizes are supported`,
    );
  }
  const ropeDim = positiveInt("rope.dimension_count", headDim);
  if (ropeDim > headDim || ropeDim % 2 !== 0) {
    fail(
      `${
        key("rope.dimension_count")
      } must be even and at most the head size ${headDim}, received ${ropeDim}`,
    );
  }

  const tokenizer = ggufTokenizerData(gguf.metadata, source);
  const used = new Set<string>();
  const tensor = (name: string): Tensor => {
    used.add(name);
    return gguf.tensors.get(name) ?? fail(`tensor '${name}' is missing`);
  };
  const tokenEmbedding = tensor(MODEL_TENSORS.tokenEmbedding);
  // Token ids are checked against it everywhere: a model without one would check nothing.
  const vocabSize = tokenizer?.tokens.length ?? tokenEmbedding.shape[0] ??
    fail(`tensor '${MODEL_TENSORS.tokenEmbedding}' has no vocabulary dimension`);
  const shaped = (name: string, shape: number[]): Tensor => {
    const t = tensor(name);
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      fail(`tensor '${name}' has shape [${t.shape.join(", ")}], expected [${shape.join(", ")}]`);
    }
    return t;
  };

  let ropeFreqFactors: Float32Array | undefined;
  if (arch.ropeFreqFactors && gguf.tensors.has(MODEL_TENSORS.ropeFreqs)) {
    ropeFreqFactors = dequantize(shaped(MODEL_TENSORS.ropeFreqs, [ropeDim / 2]));
    if (!ropeFreqFactors.every((f) => Number.isFinite(f) && f > 0)) {
      fail(`tensor '${MODEL_TENSORS.ropeFreqs}' must hold positive frequency divisors`);
    }
  }
  const hiddenDim = positiveInt("feed_forward_length");
  const nLayers = positiveInt("block_count");
  const config: ModelConfig = {
    architecture: arch.name,
    dim,
    hiddenDim,
    nLayers,
    nHeads,
    nKvHeads,
    headDim,
    vocabSize,
    contextLength: positiveInt("context_length"),
    ropeTheta: num("rope.freq_base", LLAMA_DEFAULTS.ropeTheta),
    ropeDim,
    ...(ropeFreqFactors ? { ropeFreqFactors } : {}),
    rmsEps: num("attention.layer_norm_rms_epsilon", LLAMA_DEFAULTS.rmsEps),
    ...(arch.steps.qkvBias || arch.steps.qkNorm ? { steps: arch.steps } : {}),
  };

  const qDim = nHeads * headDim;
  const kvDim = nKvHeads * headDim;
  const shapes: Record<string, number[]> = {
    attnNorm: [dim],
    wq: [qDim, dim],
    wk: [kvDim, dim],
    wv: [kvDim, dim],
    wo: [dim, qDim],
    ffnNorm: [dim],
    wGate: [hiddenDim, dim],
    wDown: [dim, hiddenDim],
    wUp: [hiddenDim, dim],
    qBias: [qDim],
    kBias: [kvDim],
    vBias: [kvDim],
    qNorm: [headDim],
    kNorm: [headDim],
  };
  const roles: Record<string, string> = {
    ...LAYER_TENSORS,
    ...(arch.steps.qkvBias ? STEP_TENSORS.qkvBias : {}),
    ...(arch.steps.qkNorm ? STEP_TENSORS.qkNorm : {}),
  };
  // Rows of q (and k) heads and of one head, reordered from "neox" pairs to adjacent ones.
  const toNorm = arch.rope === "neox"
    ? {
      q: neoxToNormOrder(nHeads, headDim, ropeDim),
      k: neoxToNormOrder(nKvHeads, headDim, ropeDim),
      head: neoxToNormOrder(1, headDim, ropeDim),
    }
    : undefined;
  const reorder: Record<string, keyof NonNullable<typeof toNorm>> = {
    wq: "q",
    qBias: "q",
    wk: "k",
    kBias: "k",
    qNorm: "head",
    kNorm: "head",
  };
  const layers: LayerWeights[] = Array.from({ length: nLayers }, (_, l) => {
    const entries = Object.entries(roles).map(([role, suffix]) => {
      const t = shaped(`blk.${l}.${suffix}`, shapes[role]!);
      const order = toNorm && reorder[role] ? toNorm[reorder[role]!] : undefined;
      return [role, order ? permuteRows(t, order) : t];
    });
    return Object.fromEntries(entries) as unknown as LayerWeights;
  });
  const weights: ModelWeights = {
    tokenEmbedding: shaped(MODEL_TENSORS.tokenEmbedding, [vocabSize, dim]),
    layers,
    outputNorm: shaped(MODEL_TENSORS.outputNorm, [dim]),
    // Files of tied models may omit the classifier; it is then the embedding table itself.
    output: gguf.tensors.has(MODEL_TENSORS.output) || !arch.tiedClassifier
      ? shaped(MODEL_TENSORS.output, [vocabSize, dim])
      : tokenEmbedding,
  };
  const unused = [...gguf.tensors.keys()].filter((n) => !used.has(n));
  if (unused.length > 0) {
    fail(
      `architecture '${arch.name}' does not use ${unused.length} of its tensors (${
        unused.slice(0, 4).join(", ")
      }${unused.length > 4 ? ", ..." : ""}); running without them would give wrong output`,
    );
  }

  const chatTemplate = meta("tokenizer.chat_template");
  const pooling = poolingOfCode(meta(key("pooling_type")));
  // Where llama.cpp reads a reranker's prompt (llama_model_chat_template(model, "rerank")).
  const rerankPrompt = meta("tokenizer.chat_template.rerank");
  return {
    config,
    weights,
    ...(tokenizer ? { tokenizer } : {}),
    ...(typeof chatTemplate === "string" ? { chatTemplate } : {}),
    ...(pooling ? { pooling } : {}),
    ...(typeof rerankPrompt === "string" ? { rerankPrompt } : {}),
    source,
  };
}
