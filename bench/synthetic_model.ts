import { f32ToF16 } from "../lib/model/dequantize.ts";
import type { ModelConfig } from "../lib/model/model_config.ts";
import {
  BLOCK_LAYOUT,
  BLOCK_SCALE_OFFSETS,
  byteSize,
  type Tensor,
  type TensorType,
} from "../lib/model/tensor.ts";
import type { LayerWeights, ModelWeights } from "../lib/model/weights.ts";

/** Llama-3.2-1B's shape: 16 layers, 2048 wide, 32 query / 8 KV heads of 64, 128256 tokens, tied. */
export const LLAMA_1B_SHAPE: ModelConfig = {
  architecture: "llama",
  dim: 2048,
  hiddenDim: 8192,
  nLayers: 16,
  nHeads: 32,
  nKvHeads: 8,
  headDim: 64,
  vocabSize: 128256,
  contextLength: 2048,
  ropeTheta: 500000,
  ropeDim: 64,
  rmsEps: 1e-5,
};

/** A seeded xorshift generator (fast enough to fill patterns, reproducible). */
function xorshift(seed: number): () => number {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) / 4294967296;
  };
}

/**
 * Random bytes for a tensor: a 1 MiB pattern of valid encoded values (small f16/bf16 weights,
 * or blocks of random quants with small f16 scales), repeated. Values only need to be finite
 * and plausible: this is for timing kernels, not for text.
 */
export function randomData(type: TensorType, bytes: number, seed: number): Uint8Array {
  const rand = xorshift(seed);
  const block = BLOCK_LAYOUT[type].bytes;
  const patternBytes = Math.min(bytes, Math.floor((1 << 20) / (block * 2)) * block * 2);
  const pattern = new Uint8Array(patternBytes);
  const view = new DataView(pattern.buffer);
  const small = () => (rand() * 2 - 1) * 0.04;
  for (let at = 0; at + block <= patternBytes; at += block) {
    switch (type) {
      case "f32":
        view.setFloat32(at, small(), true);
        break;
      case "f16":
        view.setUint16(at, f32ToF16(small()), true);
        break;
      case "bf16":
        view.setUint16(at, new Uint32Array(new Float32Array([small()]).buffer)[0]! >>> 16, true);
        break;
      default:
        for (let j = 0; j < block; j++) pattern[at + j] = Math.floor(rand() * 256);
        for (const f of BLOCK_SCALE_OFFSETS[type]) {
          view.setUint16(at + f, f32ToF16(0.005 * (0.5 + rand())), true);
        }
    }
  }
  const data = new Uint8Array(bytes);
  for (let at = 0; at < bytes; at += patternBytes) {
    data.set(pattern.subarray(0, Math.min(patternBytes, bytes - at)), at);
  }
  return data;
}

/**
 * A randomly initialised model of the given shape, matrices in `type` and norms in f32, with a
 * tied classifier. Built in memory; nothing is written to disk.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * // Llama 3.2 1B's matrices, cut to 2 layers and a 4096-token vocabulary to be quick.
 * const w = syntheticWeights({ ...LLAMA_1B_SHAPE, nLayers: 2, vocabSize: 4096 }, "q4_0");
 * assertEquals(w.layers.length, 2);
 * assertEquals([w.layers[0]!.wq.type, w.layers[0]!.wq.shape], ["q4_0", [2048, 2048]]);
 * ```
 */
export function syntheticWeights(config: ModelConfig, type: TensorType): ModelWeights {
  const { dim, hiddenDim, nLayers, nHeads, nKvHeads, headDim, vocabSize } = config;
  let seed = 1;
  const matrix = (name: string, rows: number, cols: number): Tensor => ({
    name,
    type,
    shape: [rows, cols],
    data: randomData(type, byteSize(type, [rows, cols]), seed++),
  });
  const ones = (name: string): Tensor => ({
    name,
    type: "f32",
    shape: [dim],
    data: new Uint8Array(new Float32Array(dim).fill(1).buffer),
  });
  const layers: LayerWeights[] = Array.from({ length: nLayers }, (_, l) => ({
    attnNorm: ones(`blk.${l}.attn_norm`),
    wq: matrix(`blk.${l}.attn_q`, nHeads * headDim, dim),
    wk: matrix(`blk.${l}.attn_k`, nKvHeads * headDim, dim),
    wv: matrix(`blk.${l}.attn_v`, nKvHeads * headDim, dim),
    wo: matrix(`blk.${l}.attn_output`, dim, nHeads * headDim),
    ffnNorm: ones(`blk.${l}.ffn_norm`),
    wGate: matrix(`blk.${l}.ffn_gate`, hiddenDim, dim),
    wDown: matrix(`blk.${l}.ffn_down`, dim, hiddenDim),
    wUp: matrix(`blk.${l}.ffn_up`, hiddenDim, dim),
  }));
  const tokenEmbedding = matrix("token_embd", vocabSize, dim);
  return { tokenEmbedding, layers, outputNorm: ones("output_norm"), output: tokenEmbedding };
}
