import type { ModelConfig } from "./model_config.ts";
import type { Tensor } from "./tensor.ts";
import type { LayerWeights, ModelWeights } from "./weights.ts";

const HEADER_BYTES = 7 * 4;

/**
 * Parses a karpathy llama2.c checkpoint (`run.c`'s format): a header of 7 int32 (dim,
 * hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size
 * means the classifier is stored separately), then f32 weights in a fixed order. Tensors are
 * views into `bytes`, so the file is held in memory once.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const bytes = await Deno.readFile("stories260K.bin");
 * const { config } = parseLlama2cCheckpoint(bytes, "stories260K.bin");
 * assertEquals([config.dim, config.nLayers, config.nHeads, config.nKvHeads], [64, 5, 8, 4]);
 * assertEquals([config.vocabSize, config.contextLength], [512, 512]);
 * ```
 */
export function parseLlama2cCheckpoint(
  bytes: Uint8Array,
  source: string,
): { config: ModelConfig; weights: ModelWeights } {
  if (bytes.byteLength < HEADER_BYTES) {
    throw new Error(
      `Cannot load llama2.c checkpoint ${source}: file is truncated, expected a ${HEADER_BYTES}-byte header, received ${bytes.byteLength} bytes`,
    );
  }
  const header = new DataView(bytes.buffer, bytes.byteOffset, HEADER_BYTES);
  const [dim, hiddenDim, nLayers, nHeads, nKvHeads, rawVocab, seqLen] = Array.from(
    { length: 7 },
    (_, i) => header.getInt32(i * 4, true),
  ) as [number, number, number, number, number, number, number];
  const vocabSize = Math.abs(rawVocab);
  const tied = rawVocab > 0;
  for (
    const [name, v] of Object.entries({
      dim,
      hiddenDim,
      nLayers,
      nHeads,
      nKvHeads,
      vocabSize,
      seqLen,
    })
  ) {
    if (!(v > 0 && v < 1 << 24)) {
      throw new Error(
        `Cannot load llama2.c checkpoint ${source}: header field ${name} must be a positive integer, received ${v} (is this a llama2.c .bin file?)`,
      );
    }
  }
  if (dim % nHeads !== 0 || nHeads % nKvHeads !== 0) {
    throw new Error(
      `Cannot load llama2.c checkpoint ${source}: dim ${dim} must divide by n_heads ${nHeads}, and n_heads by n_kv_heads ${nKvHeads}`,
    );
  }
  const headDim = dim / nHeads;
  const kvDim = nKvHeads * headDim;
  const config: ModelConfig = {
    architecture: "llama",
    dim,
    hiddenDim,
    nLayers,
    nHeads,
    nKvHeads,
    headDim,
    vocabSize,
    contextLength: seqLen,
    ropeTheta: 10000,
    ropeDim: headDim,
    rmsEps: 1e-5,
  };

  let offset = HEADER_BYTES;
  const take = (name: string, shape: number[]): Tensor => {
    const n = shape.reduce((a, b) => a * b, 1);
    const end = offset + n * 4;
    if (end > bytes.byteLength) {
      throw new Error(
        `Cannot load llama2.c checkpoint ${source}: file is truncated at tensor ${name}, needs ${end} bytes, received ${bytes.byteLength}`,
      );
    }
    const t: Tensor = { name, type: "f32", shape, data: bytes.subarray(offset, end) };
    offset = end;
    return t;
  };
  const perLayer = (name: string, shape: number[]) =>
    Array.from({ length: nLayers }, (_, l) => take(`layers.${l}.${name}`, shape));

  const tokenEmbedding = take("token_embedding", [vocabSize, dim]);
  const attnNorm = perLayer("attn_norm", [dim]);
  const wq = perLayer("wq", [dim, dim]);
  const wk = perLayer("wk", [kvDim, dim]);
  const wv = perLayer("wv", [kvDim, dim]);
  const wo = perLayer("wo", [dim, dim]);
  const ffnNorm = perLayer("ffn_norm", [dim]);
  const wGate = perLayer("w1", [hiddenDim, dim]);
  const wDown = perLayer("w2", [dim, hiddenDim]);
  const wUp = perLayer("w3", [hiddenDim, dim]);
  const outputNorm = take("output_norm", [dim]);
  take("freq_cis_real", [seqLen, headDim / 2]); // legacy RoPE tables, recomputed instead
  take("freq_cis_imag", [seqLen, headDim / 2]);
  const output = tied ? tokenEmbedding : take("output", [vocabSize, dim]);

  const layers: LayerWeights[] = Array.from({ length: nLayers }, (_, l) => ({
    attnNorm: attnNorm[l]!,
    wq: wq[l]!,
    wk: wk[l]!,
    wv: wv[l]!,
    wo: wo[l]!,
    ffnNorm: ffnNorm[l]!,
    wGate: wGate[l]!,
    wDown: wDown[l]!,
    wUp: wUp[l]!,
  }));
  return { config, weights: { tokenEmbedding, layers, outputNorm, output } };
}
