/**
 * What the planner needs to know of a model: its shape and how many bytes of weights each part
 * holds, read from a GGUF's header (no weights are loaded) or taken from a named shape.
 */
import { readGgufHeader, tensorLayout } from "../model/gguf.ts";
import type { GgufHeader } from "../model/gguf.ts";
import { byteSize } from "../model/tensor.ts";
import { MODEL_TENSORS } from "../model/architecture.ts";

export interface PlanModel {
  readonly name: string;
  readonly dim: number;
  readonly hiddenDim: number;
  readonly nHeads: number;
  readonly nKvHeads: number;
  readonly headDim: number;
  readonly vocabSize: number;
  /** Weight bytes of each layer (its matrices, norms and biases), in order. */
  readonly layerBytes: readonly number[];
  /** The token embedding, which the first stage holds (it reads one row per token). */
  readonly embeddingBytes: number;
  /** The classifier the last stage reads whole every step (the embedding when tied). */
  readonly classifierBytes: number;
  /** The classifier is the token embedding (one tensor, held by both ends of a pipeline). */
  readonly tiedClassifier: boolean;
}

const LLAMA_VOCAB = 128256;

/**
 * Q4_K_M's average bits per layer weight in a Llama 3 layer: the 8B perf file's 4,186,439,680
 * layer bytes over its 32 × 218,103,808 layer weights (attn_v and ffn_down of some layers at
 * Q6_K, the rest Q4_K).
 */
const Q4_K_M_LAYER_BYTES_PER_WEIGHT = 4_186_439_680 / (32 * 218_103_808);

/** A Llama 3 layer's matrix weights: q and o of dim², k and v of dim × kvDim, three FFN. */
function llamaLayerWeights(dim: number, kvDim: number, hiddenDim: number): number {
  return 2 * dim * dim + 2 * dim * kvDim + 3 * dim * hiddenDim;
}

/**
 * The named shapes: the three perf files' (their byte counts are those their headers list:
 * `/tmp/perf/*.gguf`, made by `../shared/models/perf/make_real_shape.py` with llama-quantize
 * Q4_K_M), and a Llama-3.1-70B shape at the same Q4_K_M mix, 39.6 GiB: a model that fits on
 * no single 16 GB host.
 */
export const PLAN_SHAPES: Readonly<Record<string, PlanModel>> = {
  qwen25_05b: {
    name: "qwen25_05b",
    dim: 896,
    hiddenDim: 4864,
    nHeads: 14,
    nKvHeads: 2,
    headDim: 64,
    vocabSize: 151936,
    layerBytes: Array(24).fill(247_213_056 / 24),
    embeddingBytes: 144_643_072,
    classifierBytes: 144_643_072,
    tiedClassifier: true,
  },
  llama32_1b: {
    name: "llama32_1b",
    dim: 2048,
    hiddenDim: 8192,
    nHeads: 32,
    nKvHeads: 8,
    headDim: 64,
    vocabSize: LLAMA_VOCAB,
    layerBytes: Array(16).fill(584_384_512 / 16),
    embeddingBytes: 215_470_080,
    classifierBytes: 215_470_080,
    tiedClassifier: true,
  },
  llama31_8b: {
    name: "llama31_8b",
    dim: 4096,
    hiddenDim: 14336,
    nHeads: 32,
    nKvHeads: 8,
    headDim: 128,
    vocabSize: LLAMA_VOCAB,
    layerBytes: Array(32).fill(4_186_439_680 / 32),
    embeddingBytes: 295_501_824,
    classifierBytes: 430_940_160,
    tiedClassifier: false,
  },
  llama31_70b: {
    name: "llama31_70b",
    dim: 8192,
    hiddenDim: 28672,
    nHeads: 64,
    nKvHeads: 8,
    headDim: 128,
    vocabSize: LLAMA_VOCAB,
    layerBytes: Array(80).fill(
      Math.round(llamaLayerWeights(8192, 1024, 28672) * Q4_K_M_LAYER_BYTES_PER_WEIGHT),
    ),
    embeddingBytes: byteSize("q4_k", [LLAMA_VOCAB, 8192]),
    classifierBytes: byteSize("q6_k", [LLAMA_VOCAB, 8192]),
    tiedClassifier: false,
  },
};

export const PLAN_SHAPE_NAMES = Object.keys(PLAN_SHAPES);

/** Every weight byte of the model (a tied classifier counted once). */
export function modelBytes(m: PlanModel): number {
  const layers = m.layerBytes.reduce((a, b) => a + b, 0);
  return layers + m.embeddingBytes + (m.tiedClassifier ? 0 : m.classifierBytes);
}

/** The planner's view of a GGUF header: shape from `<arch>.*`, bytes from the tensor infos. */
export function planModelFromHeader(header: GgufHeader, name: string): PlanModel {
  const arch = String(header.metadata.get("general.architecture")?.value ?? "");
  const num = (key: string, fallback?: number): number => {
    const v = header.metadata.get(`${arch}.${key}`)?.value ?? fallback;
    if (typeof v !== "number" || !Number.isInteger(v) || v <= 0) {
      throw new Error(
        `Cannot plan for ${name}: metadata '${arch}.${key}' must be a positive integer, received ${
          String(v)
        }`,
      );
    }
    return v;
  };
  const nLayers = num("block_count");
  const dim = num("embedding_length");
  const nHeads = num("attention.head_count");
  const layerBytes = Array<number>(nLayers).fill(0);
  const bytes = new Map<string, number>();
  for (const info of header.tensorInfos) {
    const size = tensorLayout(info, name).bytes;
    const layer = /^blk\.(\d+)\./.exec(info.name);
    if (layer && Number(layer[1]) < nLayers) layerBytes[Number(layer[1])]! += size;
    else bytes.set(info.name, size);
  }
  const embeddingBytes = bytes.get(MODEL_TENSORS.tokenEmbedding);
  if (embeddingBytes === undefined) {
    throw new Error(`Cannot plan for ${name}: tensor '${MODEL_TENSORS.tokenEmbedding}' is missing`);
  }
  const keyLength = header.metadata.get(`${arch}.attention.key_length`)?.value;
  return {
    name,
    dim,
    hiddenDim: num("feed_forward_length"),
    nHeads,
    nKvHeads: num("attention.head_count_kv", nHeads),
    headDim: typeof keyLength === "number" ? keyLength : dim / nHeads,
    vocabSize: num(
      "vocab_size",
      header.tensorInfos.find((t) => t.name === MODEL_TENSORS.tokenEmbedding)?.dims[1],
    ),
    layerBytes,
    embeddingBytes,
    classifierBytes: bytes.get(MODEL_TENSORS.output) ?? embeddingBytes,
    tiedClassifier: !bytes.has(MODEL_TENSORS.output),
  };
}

/** A named shape, or a GGUF file's header read into one. */
export async function planModel(spec: string): Promise<PlanModel> {
  const shape = PLAN_SHAPES[spec];
  if (shape !== undefined) return shape;
  let header: GgufHeader;
  try {
    header = await readGgufHeader(spec);
  } catch (e) {
    throw new Error(
      `Cannot plan for model "${spec}": it is neither a shape (${
        PLAN_SHAPE_NAMES.join(", ")
      }) nor a readable GGUF file (${(e as Error).message})`,
    );
  }
  return planModelFromHeader(header, spec.split("/").pop() ?? spec);
}
