import { describeGgufValue, type GgufHeader, readGgufHeader } from "./gguf.ts";
import { ByteStrings } from "../util/byte_strings.ts";
import { SUPPORTED_PRE_TOKENIZERS } from "../tokenizer/pre_tokenizer.ts";
import type { TokenizerData, TokenizerModel } from "../tokenizer/tokenizer_data.ts";

const SUPPORTED_TOKENIZERS: readonly TokenizerModel[] = ["llama", "gpt2"];

type Metadata = GgufHeader["metadata"];

/**
 * Why this file's vocabulary cannot be used (unknown `tokenizer.ggml.model` or, for byte-level
 * BPE, `tokenizer.ggml.pre`), or undefined when it can; for listing every blocker of a file at once.
 */
export function tokenizerBlocker(metadata: Metadata): string | undefined {
  const model = metadata.get("tokenizer.ggml.model")?.value;
  if (model === undefined) return undefined;
  if (typeof model !== "string" || !(SUPPORTED_TOKENIZERS as string[]).includes(model)) {
    return `tokenizer model '${
      String(model)
    }' (tokenizer.ggml.model) is not supported (supported: ${SUPPORTED_TOKENIZERS.join(", ")})`;
  }
  if (model === "gpt2") {
    const pre = metadata.get("tokenizer.ggml.pre")?.value ?? "default";
    if (typeof pre !== "string" || !SUPPORTED_PRE_TOKENIZERS.includes(pre)) {
      return `pre-tokenizer '${String(pre)}' (tokenizer.ggml.pre) is not supported (supported: ${
        SUPPORTED_PRE_TOKENIZERS.join(", ")
      })`;
    }
  }
  return undefined;
}

/**
 * The vocabulary from a GGUF's `tokenizer.ggml.*` metadata; undefined when the file has none.
 * Throws, naming the key and what it held, when a value has the wrong type or an id is out of range.
 */
export function ggufTokenizerData(metadata: Metadata, source: string): TokenizerData | undefined {
  const fail = (what: string): never => {
    throw new Error(`Cannot load GGUF ${source}: ${what}`);
  };
  const meta = (key: string) => metadata.get(key)?.value;
  const model = meta("tokenizer.ggml.model");
  if (model === undefined) return undefined;
  const blocker = tokenizerBlocker(metadata);
  if (blocker) return fail(blocker);
  const kind = model as TokenizerModel;
  const tokens = meta("tokenizer.ggml.tokens");
  if (!Array.isArray(tokens) || !tokens.every((t) => typeof t === "string")) {
    return fail(
      `metadata 'tokenizer.ggml.tokens' must be an array of strings, received ${
        describeGgufValue(tokens)
      }`,
    );
  }
  const n = tokens.length;
  // Every token id is checked against n: an empty vocabulary would leave nothing to check with.
  if (n === 0) fail("metadata 'tokenizer.ggml.tokens' must hold at least one token, received []");
  const rawScores = meta("tokenizer.ggml.scores");
  let scores: Float32Array;
  if (rawScores === undefined) {
    scores = new Float32Array(n);
  } else if (rawScores instanceof Float32Array && rawScores.length === n) {
    scores = rawScores;
  } else {
    return fail(
      `metadata 'tokenizer.ggml.scores' must be ${n} float32 values, received ${
        describeGgufValue(rawScores)
      }`,
    );
  }
  const rawTypes = meta("tokenizer.ggml.token_type");
  let tokenTypes: Int32Array | undefined;
  if (rawTypes !== undefined) {
    if (
      !(rawTypes instanceof Int32Array || rawTypes instanceof Uint32Array) || rawTypes.length !== n
    ) {
      return fail(
        `metadata 'tokenizer.ggml.token_type' must be ${n} int32 values, received ${
          describeGgufValue(rawTypes)
        }`,
      );
    }
    tokenTypes = rawTypes instanceof Int32Array ? rawTypes : new Int32Array(rawTypes);
  }
  let merges: string[] | ByteStrings | undefined;
  if (kind === "gpt2") {
    const raw = meta("tokenizer.ggml.merges");
    if (raw instanceof ByteStrings && raw.length > 0) {
      merges = raw;
    } else if (
      !Array.isArray(raw) || raw.length === 0 || !raw.every((t) => typeof t === "string")
    ) {
      return fail(
        `metadata 'tokenizer.ggml.merges' must be a non-empty array of strings for a byte-level BPE vocabulary, received ${
          describeGgufValue(raw)
        }`,
      );
    } else {
      merges = raw as string[];
    }
  }
  const id = (key: string, fallback?: number): number | undefined => {
    const v = meta(key) ?? fallback;
    if (v === undefined) return undefined;
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v >= n) {
      return fail(
        `metadata '${key}' must be a token id below ${n}, received ${describeGgufValue(v)}`,
      );
    }
    return v;
  };
  const flag = (key: string): boolean | undefined => {
    const v = meta(key);
    if (v === undefined) return undefined;
    if (typeof v !== "boolean") {
      return fail(`metadata '${key}' must be a boolean, received ${describeGgufValue(v)}`);
    }
    return v;
  };
  const pre = meta("tokenizer.ggml.pre");
  // llama.cpp's defaults when the ids are absent: <s> 1 and </s> 2 for SentencePiece, 11 for GPT-2 BPE.
  const optional = {
    addBos: flag("tokenizer.ggml.add_bos_token"),
    addEos: flag("tokenizer.ggml.add_eos_token"),
    addSpacePrefix: flag("tokenizer.ggml.add_space_prefix"),
    eotId: id("tokenizer.ggml.eot_token_id"),
    eomId: id("tokenizer.ggml.eom_token_id"),
    fimPadId: id("tokenizer.ggml.fim_pad_token_id"),
    fimRepId: id("tokenizer.ggml.fim_rep_token_id"),
    fimSepId: id("tokenizer.ggml.fim_sep_token_id"),
  };
  return {
    model: kind,
    tokens: tokens as string[],
    scores,
    ...(tokenTypes ? { tokenTypes } : {}),
    ...(merges ? { merges } : {}),
    ...(typeof pre === "string" ? { pre } : {}),
    bosId: id("tokenizer.ggml.bos_token_id", kind === "gpt2" ? 11 : 1)!,
    eosId: id("tokenizer.ggml.eos_token_id", kind === "gpt2" ? 11 : 2)!,
    ...Object.fromEntries(Object.entries(optional).filter(([, v]) => v !== undefined)),
  };
}

/**
 * Reads only a GGUF's vocabulary, from its header (not the tensor data): enough to tokenize
 * with a file whose weights are not loaded or not supported.
 */
export async function readGgufTokenizer(path: string): Promise<TokenizerData | undefined> {
  return ggufTokenizerData((await readGgufHeader(path)).metadata, path);
}
