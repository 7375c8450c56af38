import { LLAMA_DEFAULTS, type ModelConfig } from "./model_config.ts";
import type { Tensor } from "./tensor.ts";
import type { LayerWeights, ModelWeights } from "./weights.ts";

/** The header's int32 fields in file order (run.c's Config). */
const HEADER_FIELDS = [
  "dim",
  "hiddenDim",
  "nLayers",
  "nHeads",
  "nKvHeads",
  "vocabSize",
  "seqLen",
] as const;
/** Bytes of a llama2.c checkpoint's header. */
export const LLAMA2C_HEADER_BYTES = HEADER_FIELDS.length * 4;

/** A llama2.c header: vocabSize as a count, its sign (positive: classifier tied) in `tied`. */
export type Llama2cHeader = Record<(typeof HEADER_FIELDS)[number], number> & {
  readonly tied: boolean;
};

/** The header at the start of `bytes` (at least LLAMA2C_HEADER_BYTES of them). */
export function llama2cHeader(bytes: Uint8Array): Llama2cHeader {
  const view = new DataView(bytes.buffer, bytes.byteOffset, LLAMA2C_HEADER_BYTES);
  const field = (i: number) => view.getInt32(i * 4, true);
  const vocabAt = HEADER_FIELDS.indexOf("vocabSize");
  const h = Object.fromEntries(
    HEADER_FIELDS.map((name, i) => [name, i === vocabAt ? Math.abs(field(i)) : field(i)]),
  ) as Record<(typeof HEADER_FIELDS)[number], number>;
  return { ...h, tied: field(vocabAt) > 0 };
}

/**
 * Why `h` cannot be a llama2.c checkpoint's header, or undefined where it is plausible (every
 * field a positive integer below 2^24, heads that divide dim and are divided by the KV heads).
 */
export function llama2cHeaderProblem(h: Llama2cHeader): string | undefined {
  for (const name of HEADER_FIELDS) {
    const v = h[name];
    if (!(v > 0 && v < 1 << 24)) {
      return `header field ${name} must be a positive integer, received ${v} (is this a llama2.c .bin file?)`;
    }
  }
  if (h.dim % h.nHeads !== 0 || h.nHeads % h.nKvHeads !== 0) {
    return `dim ${h.dim} must divide by n_heads ${h.nHeads}, and n_heads by n_kv_heads ${h.nKvHeads}`;
  }
  return undefined;
}

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
  if (bytes.byteLength < LLAMA2C_HEADER_BYTES) {
    throw new Error(
      `Cannot load llama2.c checkpoint ${source}: file is truncated, expected a ${LLAMA2C_HEADER_BYTES}-byte header, received ${bytes.byteLength} bytes`,
    );
  }
  const header = llama2cHeader(bytes);
  const problem = llama2cHeaderProblem(header);
  if (problem !== undefined) {
    throw new Error(`Cannot load llama2.c checkpoint ${source}: ${problem}`);
  }
  const { seqLen, tied, ...shape } = header;
  const { dim, hiddenDim, nLayers, nHeads, nKvHeads, vocabSize } = shape;
  const headDim = dim / nHeads;
  const kvDim = nKvHeads * headDim;
  const config: ModelConfig = {
    architecture: "llama",
    ...shape,
    headDim,
    contextLength: seqLen,
    ropeDim: headDim,
    ...LLAMA_DEFAULTS,
  };

  let offset = LLAMA2C_HEADER_BYTES;
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
