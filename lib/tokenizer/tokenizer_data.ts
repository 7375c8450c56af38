import type { ByteStrings } from "../util/byte_strings.ts";

/** Which algorithm a vocabulary is for, as GGUF's `tokenizer.ggml.model` names it. */
export type TokenizerModel =
  /** SentencePiece-style BPE: merges by token score, "▁" for a space, `<0xXX>` byte fallback. */
  | "llama"
  /** Byte-level BPE (GPT-2, Llama 3, Qwen): a regex pre-tokenizer, then merges by rank over bytes spelled as characters. */
  | "gpt2";

/** What a vocabulary file provides, before any tokenizer logic. */
export interface TokenizerData {
  /** Token pieces as the file spells them (SentencePiece files use "▁" for a space; byte pieces look like "<0x0A>"; byte-level BPE spells bytes as GPT-2's printable characters, "Ġ" for a space). */
  readonly tokens: readonly string[];
  readonly scores: Float32Array;
  /** Token types (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte) where the file has them. */
  readonly tokenTypes?: Int32Array;
  readonly bosId: number;
  readonly eosId: number;
  /** Default "llama". */
  readonly model?: TokenizerModel;
  /** `tokenizer.ggml.pre`: the pre-tokenizer of a byte-level BPE vocabulary ("llama-bpe", "qwen2", ...). */
  readonly pre?: string;
  /** `tokenizer.ggml.merges` ("Ġ t", rank = index; as strings or, from a GGUF, as bytes); required for "gpt2". */
  readonly merges?: readonly string[] | ByteStrings;
  /** Whether encoding a prompt starts with BOS (`tokenizer.ggml.add_bos_token`); by default true for "llama", and for "gpt2" only with a Llama 3 pre-tokenizer (llama.cpp's defaults). */
  readonly addBos?: boolean;
  /** Whether encoding a prompt ends with EOS (`tokenizer.ggml.add_eos_token`, default false). */
  readonly addEos?: boolean;
  /** SentencePiece's dummy "▁" before text (`tokenizer.ggml.add_space_prefix`, default true for "llama"). */
  readonly addSpacePrefix?: boolean;
  /** Ids named by `tokenizer.ggml.{eot,eom,fim_pad,fim_rep,fim_sep}_token_id`; they end a generation. */
  readonly eotId?: number;
  readonly eomId?: number;
  readonly fimPadId?: number;
  readonly fimRepId?: number;
  readonly fimSepId?: number;
}
