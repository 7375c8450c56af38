import type { ModelConfig } from "../lib/model/model_config.ts";
import { byteSize, type Tensor, type TensorType } from "../lib/model/tensor.ts";
import type { LayerWeights, ModelWeights } from "../lib/model/weights.ts";
import { LLAMA_1B_SHAPE, randomData } from "./synthetic_model.ts";

/**
 * The two real-proportioned shapes of ../shared/models/perf (Qwen2.5-0.5B and Llama-3.2-1B), with
 * each tensor in the encoding llama-quantize's Q4_K_M gives it in those files, built in memory
 * with random weights. For a machine that cannot make the files (no Python or llama.cpp there,
 * and 400-800 MB is too much to carry): the kernels read the same bytes per token as they do
 * on the files.
 */
export type PerfShape = "qwen25_05b" | "llama32_1b";

export const PERF_SHAPES: readonly PerfShape[] = ["qwen25_05b", "llama32_1b"];

const CONFIGS: Record<PerfShape, ModelConfig> = {
  qwen25_05b: {
    architecture: "qwen2",
    dim: 896,
    hiddenDim: 4864,
    nLayers: 24,
    nHeads: 14,
    nKvHeads: 2,
    headDim: 64,
    vocabSize: 151936,
    contextLength: 32768,
    ropeTheta: 1000000,
    ropeDim: 64,
    rmsEps: 1e-6,
    steps: { qkvBias: true, qkNorm: false },
  },
  // Llama-3.2-1B's file lists a 128k context; the shape is the synthetic benchmark's.
  llama32_1b: { ...LLAMA_1B_SHAPE, contextLength: 131072 },
};

export function perfShapeConfig(shape: PerfShape): ModelConfig {
  return CONFIGS[shape];
}

/**
 * llama.cpp's `use_more_bits(i, n)`: the layers Q4_K_M gives more bits in attn_v and ffn_down
 * (the first and last eighth, and every third one between).
 */
export function usesMoreBits(layer: number, layers: number): boolean {
  const eighth = Math.floor(layers / 8);
  return layer < eighth || layer >= Math.floor((7 * layers) / 8) ||
    (layer - eighth) % 3 === 2;
}

/**
 * The encoding llama-quantize's Q4_K_M gives each tensor (`token_embd`, `attn_q`, … `ffn_down`)
 * of layer `layer` of `layers` in a file of this shape's family, as the perf files' headers list
 * it. In the Qwen shape the 896-wide rows are not whole 256-element blocks, so
 * llama-quantize falls back from Q4_K to Q5_0 and from Q6_K to Q8_0 there; ffn_down (4864 wide)
 * keeps K-quants.
 */
export function perfTensorType(
  shape: PerfShape,
  tensor: string,
  layer: number,
  layers = CONFIGS[shape].nLayers,
): TensorType {
  const more = usesMoreBits(layer, layers);
  if (shape === "llama32_1b") {
    if (tensor === "token_embd") return "q6_k";
    if (tensor === "attn_v" || tensor === "ffn_down") return more ? "q6_k" : "q4_k";
    return "q4_k";
  }
  if (tensor === "token_embd") return "q8_0";
  if (tensor === "ffn_down") return more ? "q6_k" : "q4_k";
  if (tensor === "attn_v") return more ? "q8_0" : "q5_0";
  return "q5_0";
}

/**
 * A random model of a perf shape, tied classifier, f32 norms and biases.
 *
 * ```ts
 * const { config, weights } = perfShapeModel("llama32_1b", 2); // 2 of its 16 layers
 * console.log(weights.layers[0]!.wGate.type); // "q4_k"
 * ```
 */
export function perfShapeModel(
  shape: PerfShape,
  layers?: number,
): { config: ModelConfig; weights: ModelWeights } {
  const full = CONFIGS[shape];
  const config = { ...full, nLayers: layers ?? full.nLayers };
  const { dim, hiddenDim, nHeads, nKvHeads, headDim, vocabSize } = config;
  let seed = 1;
  const matrix = (name: string, tensor: string, layer: number, rows: number, cols: number) => {
    const type = perfTensorType(shape, tensor, layer, config.nLayers);
    return {
      name,
      type,
      shape: [rows, cols],
      data: randomData(type, byteSize(type, [rows, cols]), seed++),
    } satisfies Tensor;
  };
  const f32 = (name: string, n: number, value: (i: number) => number): Tensor => ({
    name,
    type: "f32",
    shape: [n],
    data: new Uint8Array(Float32Array.from({ length: n }, (_, i) => value(i)).buffer),
  });
  const ones = (name: string) => f32(name, dim, () => 1);
  const bias = (name: string, n: number) => f32(name, n, (i) => 0.01 * Math.sin(i));
  const layerWeights: LayerWeights[] = Array.from({ length: config.nLayers }, (_, l) => ({
    attnNorm: ones(`blk.${l}.attn_norm`),
    wq: matrix(`blk.${l}.attn_q`, "attn_q", l, nHeads * headDim, dim),
    wk: matrix(`blk.${l}.attn_k`, "attn_k", l, nKvHeads * headDim, dim),
    wv: matrix(`blk.${l}.attn_v`, "attn_v", l, nKvHeads * headDim, dim),
    wo: matrix(`blk.${l}.attn_output`, "attn_output", l, dim, nHeads * headDim),
    ffnNorm: ones(`blk.${l}.ffn_norm`),
    wGate: matrix(`blk.${l}.ffn_gate`, "ffn_gate", l, hiddenDim, dim),
    wDown: matrix(`blk.${l}.ffn_down`, "ffn_down", l, dim, hiddenDim),
    wUp: matrix(`blk.${l}.ffn_up`, "ffn_up", l, hiddenDim, dim),
    ...(config.steps?.qkvBias
      ? {
        qBias: bias(`blk.${l}.attn_q.bias`, nHeads * headDim),
        kBias: bias(`blk.${l}.attn_k.bias`, nKvHeads * headDim),
        vBias: bias(`blk.${l}.attn_v.bias`, nKvHeads * headDim),
      }
      : {}),
  }));
  const tokenEmbedding = matrix("token_embd", "token_embd", 0, vocabSize, dim);
  return {
    config,
    weights: {
      tokenEmbedding,
      layers: layerWeights,
      outputNorm: ones("output_norm"),
      output: tokenEmbedding,
    },
  };
}
