import { bytesToChars } from "./byte_unicode.ts";
import { mergeWord } from "./bpe_merge.ts";
import { MergeRanks } from "./merge_ranks.ts";
import type { ByteStrings } from "../util/byte_strings.ts";
import type { PreTokenizer } from "./pre_tokenizer.ts";

/** Distinct words remembered before the cache starts over (prompts repeat most of their words). */
const WORD_CACHE_LIMIT = 1 << 16;

/**
 * Byte-level BPE as llama.cpp's llm_tokenizer_bpe does it: the pre-tokenizer cuts text into
 * words, each word's UTF-8 bytes are spelled as GPT-2 characters and merged by rank, and each
 * resulting symbol becomes its token (or, if the vocabulary lacks it, one token per byte).
 */
export class BpeEncoder {
  readonly #pre: PreTokenizer;
  readonly #ranks: MergeRanks;
  readonly #ids: ReadonlyMap<string, number>;
  readonly #cache = new Map<string, readonly number[]>();

  /** `ids`: every token's text to its id (llama.cpp's token_to_id, all types included). */
  constructor(
    pre: PreTokenizer,
    merges: readonly string[] | ByteStrings,
    ids: ReadonlyMap<string, number>,
  ) {
    this.#pre = pre;
    this.#ids = ids;
    this.#ranks = new MergeRanks(merges);
  }

  get mergeCount(): number {
    return this.#ranks.size;
  }

  /** Encodes one run of plain text. */
  encode(text: string, out: number[]): void {
    if (text.length === 0) return;
    for (const word of this.#pre.split(text)) {
      let ids = this.#cache.get(word);
      if (ids === undefined) {
        ids = this.#encodeWord(word);
        if (this.#cache.size >= WORD_CACHE_LIMIT) this.#cache.clear();
        this.#cache.set(word, ids);
      }
      for (const id of ids) out.push(id);
    }
  }

  #encodeWord(word: string): number[] {
    const chars = bytesToChars(word);
    if (this.#pre.ignoreMerges) {
      const whole = this.#ids.get(chars);
      if (whole !== undefined) return [whole];
    }
    const out: number[] = [];
    for (const symbol of mergeWord([...chars], this.#ranks)) {
      const id = this.#ids.get(symbol);
      if (id !== undefined) {
        out.push(id);
        continue;
      }
      for (const ch of symbol) {
        const byteId = this.#ids.get(ch);
        if (byteId === undefined) {
          throw new Error(
            `Cannot encode ${JSON.stringify(word)}: the vocabulary has no token for the byte ${
              JSON.stringify(ch)
            } (is tokenizer.ggml.tokens a byte-level vocabulary?)`,
          );
        }
        out.push(byteId);
      }
    }
    return out;
  }
}
