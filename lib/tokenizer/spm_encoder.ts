import { BinaryHeap } from "../util/binary_heap.ts";
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

  /**
   * Greedy merging with a heap over a linked list: O(n log n), yet it picks the same pair as
   * run.c's full rescan each round (highest score, then leftmost), because list nodes keep
   * their original positions in order and stale heap entries are recognised by version stamps.
   */
  #merge(initial: readonly number[]): number[] {
    const n = initial.length;
    const ids = Int32Array.from(initial);
    const next = new Int32Array(n);
    const prev = new Int32Array(n);
    const version = new Uint32Array(n);
    for (let i = 0; i < n; i++) {
      next[i] = i + 1 < n ? i + 1 : -1;
      prev[i] = i - 1;
    }
    // Highest score first; among equal scores the leftmost pair, as in run.c's scan.
    const heap = new BinaryHeap<PairEntry>((x, y) =>
      x.score > y.score || (x.score === y.score && x.left < y.left)
    );
    const consider = (left: number, right: number) => {
      if (left < 0 || right < 0) return;
      const merged = this.#lookup.get(this.#pieces[ids[left]!]! + this.#pieces[ids[right]!]!);
      if (merged === undefined) return;
      const score = this.#scores[merged]!;
      if (!(score > MIN_MERGE_SCORE)) return;
      heap.push({
        score,
        left,
        right,
        merged,
        leftVersion: version[left]!,
        rightVersion: version[right]!,
      });
    };
    for (let i = 0; i + 1 < n; i++) consider(i, i + 1);

    for (let top = heap.pop(); top; top = heap.pop()) {
      const { left, right } = top;
      if (
        next[left] !== right || version[left] !== top.leftVersion ||
        version[right] !== top.rightVersion
      ) continue;
      ids[left] = top.merged;
      version[left]!++;
      version[right]!++;
      const after = next[right]!;
      next[left] = after;
      if (after >= 0) prev[after] = left;
      next[right] = -1;
      consider(prev[left]!, left);
      consider(left, after);
    }

    const out: number[] = [];
    for (let i = n > 0 ? 0 : -1; i >= 0; i = next[i]!) out.push(ids[i]!);
    return out;
  }
}

interface PairEntry {
  score: number;
  left: number;
  right: number;
  merged: number;
  leftVersion: number;
  rightVersion: number;
}
