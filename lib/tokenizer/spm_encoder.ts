import { mergeAdjacent } from "./adjacent_merge.ts";
import { TokenType } from "./token_types.ts";

/** run.c starts its best-pair search at this score, so pairs scoring at or below it never merge. */
const MIN_MERGE_SCORE = -1e10;

/**
 * SentencePiece-style BPE with scores and byte fallback, as karpathy's llama2.c `run.c` and
 * llama.cpp's SPM tokenizer do it: one symbol per code point (its UTF-8 bytes as `<0xXX>` tokens
 * when the vocabulary lacks it), then repeatedly merge the adjacent pair whose concatenation is
 * the highest-scoring token (leftmost on ties) until no pair merges.
 */
export class SpmEncoder {
  /** Pieces with "▁" turned into " ". */
  readonly #pieces: readonly string[];
  readonly #scores: Float32Array;
  /** Pieces that text may turn into: normal and user-defined tokens, first id wins. */
  readonly #lookup = new Map<string, number>();
  readonly #byteToken: Int32Array;
  readonly #unknownId: number;
  readonly #encoder = new TextEncoder();

  constructor(
    pieces: readonly string[],
    scores: Float32Array,
    types: Uint8Array,
    byteToken: Int32Array,
  ) {
    this.#pieces = pieces;
    this.#scores = scores;
    this.#byteToken = byteToken;
    let unknownId = -1;
    for (let id = 0; id < pieces.length; id++) {
      const type = types[id]!;
      const piece = pieces[id]!;
      if (type === TokenType.UNKNOWN) {
        if (unknownId === -1) unknownId = id;
      } else if (
        (type === TokenType.NORMAL || type === TokenType.USER_DEFINED ||
          type === TokenType.UNDEFINED) && piece !== ""
      ) {
        // Control, byte, unknown and unused pieces stay out: text spelling "<s>" or "<0x0A>" is just text.
        if (!this.#lookup.has(piece)) this.#lookup.set(piece, id);
      }
    }
    this.#unknownId = unknownId;
  }

  /** Encodes one run of plain text, with SentencePiece's dummy-prefix space when `prefix`. */
  encode(text: string, prefix: boolean, out: number[]): void {
    if (text.length === 0) return;
    const ids: number[] = [];
    if (prefix) this.#pushSymbol(" ", ids);
    for (const ch of text) this.#pushSymbol(ch, ids);
    for (const id of this.#merge(ids)) out.push(id);
  }

  #pushSymbol(symbol: string, ids: number[]): void {
    const id = this.#lookup.get(symbol);
    if (id !== undefined) {
      ids.push(id);
      return;
    }
    for (const b of this.#encoder.encode(symbol)) {
      const byteId = this.#byteToken[b]!;
      if (byteId >= 0) ids.push(byteId);
      else if (this.#unknownId >= 0) ids.push(this.#unknownId);
      else {
        throw new Error(
          `Cannot encode ${
            JSON.stringify(symbol)
          }: the vocabulary has neither this piece nor a byte token <0x${
            b.toString(16).toUpperCase().padStart(2, "0")
          }>, and no unknown token`,
        );
      }
    }
  }

  /** Greedy merging as run.c does it: the highest-scoring adjacent pair first, then leftmost. */
  #merge(initial: readonly number[]): number[] {
    const ids = Int32Array.from(initial);
    const kept = mergeAdjacent<{ score: number; merged: number }>(
      ids.length,
      (left, right) => {
        const merged = this.#lookup.get(this.#pieces[ids[left]!]! + this.#pieces[ids[right]!]!);
        if (merged === undefined) return undefined;
        const score = this.#scores[merged]!;
        return score > MIN_MERGE_SCORE ? { score, merged } : undefined;
      },
      (a, b) => a.score > b.score,
      (left, _right, key) => ids[left] = key.merged,
    );
    return kept.map((i) => ids[i]!);
  }
}
