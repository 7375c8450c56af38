import type { TokenizerData } from "./tokenizer_data.ts";

/** SentencePiece token types as GGUF's `tokenizer.ggml.token_type` stores them. */
const TYPE_NORMAL = 1;
const TYPE_UNKNOWN = 2;
const TYPE_CONTROL = 3;
const TYPE_USER_DEFINED = 4;
const TYPE_BYTE = 6;

/** run.c starts its best-pair search at this score, so pairs scoring at or below it never merge. */
const MIN_MERGE_SCORE = -1e10;

const BYTE_PIECE = /^<0x([0-9A-Fa-f]{2})>$/;

export interface EncodeOptions {
  /** Prepend the BOS token (default true, as llama2.c's generate does). */
  bos?: boolean;
  /**
   * Text spelling a control token's piece ("<s>", "</s>", "<|im_start|>") becomes that token,
   * as chat templates expect; text between them is encoded on its own (default false: such text
   * is just characters, so user content cannot inject control tokens).
   */
  special?: boolean;
  /** Append the EOS token (default false). */
  eos?: boolean;
}

export interface DecodeOptions {
  /**
   * The ids follow a BOS token that is not among them, so the first piece drops one leading
   * space (run.c's rule, which removes the dummy prefix encode added).
   */
  afterBos?: boolean;
}

/** Turns a stream of token ids into text without ever splitting a UTF-8 character. */
export interface IncrementalDecoder {
  /** Returns the text that became complete with this token (possibly ""). */
  push(id: number): string;
  /** Returns whatever is still held back (incomplete bytes become U+FFFD) and resets. */
  flush(): string;
}

/**
 * A SentencePiece-style BPE tokenizer with scores and byte fallback, behaving like karpathy's
 * llama2.c `run.c`. Works from a llama2.c `tokenizer.bin` (spaces spelled " ") and from GGUF
 * vocabularies (spaces spelled "▁", byte pieces marked with token type 6) alike.
 *
 * ```ts
 * const tok = new Tokenizer(parseLlama2cTokenizer(bytes, 512, "tok512.bin"));
 * tok.encode("Once upon a time"); // [1, 403, 407, 261, 378]
 * ```
 */
export class Tokenizer {
  readonly bosId: number;
  readonly eosId: number;
  readonly vocabSize: number;
  /** Pieces with "▁" turned into " ". */
  readonly #pieces: readonly string[];
  readonly #scores: Float32Array;
  /** Effective SentencePiece type of each id (inferred when the file has none). */
  readonly #types: Uint8Array;
  /** Byte value of each byte token, -1 for other tokens. */
  readonly #byteOf: Int16Array;
  /** Token id of each byte value's `<0xXX>` piece, -1 when the vocabulary lacks it. */
  readonly #byteToken: Int32Array;
  /** Pieces that text may turn into: normal and user-defined tokens, first id wins. */
  readonly #lookup: Map<string, number>;
  readonly #unknownId: number;
  readonly #pieceBytes: (Uint8Array | undefined)[];

  /** Builds the lookup tables; throws if the vocabulary's arrays disagree or its BOS/EOS ids are out of range. */
  constructor(data: TokenizerData) {
    const n = data.tokens.length;
    const fail = (why: string): never => {
      throw new Error(`Cannot build tokenizer: ${why}`);
    };
    if (n === 0) fail("the vocabulary is empty");
    if (data.scores.length !== n) {
      fail(`the vocabulary has ${n} tokens but ${data.scores.length} scores`);
    }
    if (data.tokenTypes && data.tokenTypes.length !== n) {
      fail(`the vocabulary has ${n} tokens but ${data.tokenTypes.length} token types`);
    }
    for (const [name, id] of [["BOS", data.bosId], ["EOS", data.eosId]] as const) {
      if (!Number.isInteger(id) || id < 0 || id >= n) {
        fail(`${name} id must be a token id in 0..${n - 1}, received ${id}`);
      }
    }
    this.bosId = data.bosId;
    this.eosId = data.eosId;
    this.vocabSize = n;
    this.#scores = data.scores;
    this.#pieces = data.tokens.map((t) => t.replaceAll("\u2581", " "));
    this.#types = new Uint8Array(n);
    this.#byteOf = new Int16Array(n).fill(-1);
    this.#byteToken = new Int32Array(256).fill(-1);
    this.#lookup = new Map();
    this.#pieceBytes = new Array(n);
    let unknownId = -1;
    for (let id = 0; id < n; id++) {
      const piece = this.#pieces[id]!;
      const type = data.tokenTypes ? data.tokenTypes[id]! : inferType(id, piece, data);
      this.#types[id] = type;
      if (type === TYPE_BYTE) {
        const m = BYTE_PIECE.exec(piece);
        if (!m) {
          fail(
            `token ${id} has type 6 (byte) but its piece ${
              JSON.stringify(piece)
            } is not of the form <0xXX>`,
          );
        }
        const value = parseInt(m![1]!, 16);
        this.#byteOf[id] = value;
        if (this.#byteToken[value] === -1) this.#byteToken[value] = id;
      } else if (type === TYPE_UNKNOWN) {
        if (unknownId === -1) unknownId = id;
      } else if (
        (type === TYPE_NORMAL || type === TYPE_USER_DEFINED || type === 0) && piece !== ""
      ) {
        // Control, byte and unknown pieces stay out: text spelling "<s>" or "<0x0A>" is just text.
        if (!this.#lookup.has(piece)) this.#lookup.set(piece, id);
      }
    }
    this.#unknownId = unknownId;
  }

  /**
   * Encodes text as llama2.c's `encode` does: optional BOS, a dummy-prefix space when the text
   * is non-empty, one token per code point (its UTF-8 bytes as `<0xXX>` tokens when the
   * vocabulary lacks it), then repeatedly merges the adjacent pair whose concatenation is the
   * highest-scoring token (leftmost on ties) until no pair merges.
   */
  encode(text: string, opts: EncodeOptions = {}): number[] {
    const out: number[] = [];
    if (opts.bos ?? true) out.push(this.bosId);
    if (opts.special) {
      this.#splitSpecial(text).forEach((part, i) => {
        if (typeof part === "number") out.push(part);
        else this.#encodeText(part, i === 0, out);
      });
    } else {
      this.#encodeText(text, true, out);
    }
    if (opts.eos ?? false) out.push(this.eosId);
    return out;
  }

  /** One run of plain text; the dummy-prefix space only where the text starts the prompt. */
  #encodeText(text: string, atStart: boolean, out: number[]): void {
    if (text.length === 0) return;
    const ids: number[] = [];
    if (atStart) this.#pushSymbol(" ", ids);
    for (const ch of text) this.#pushSymbol(ch, ids);
    for (const id of this.#merge(ids)) out.push(id);
  }

  #specials?: { piece: string; id: number }[];

  /** Splits text at control-token pieces, longest first, leftmost match. */
  #splitSpecial(text: string): (string | number)[] {
    this.#specials ??= Array.from(this.#pieces.entries())
      .filter(([id, piece]) => this.#types[id] === TYPE_CONTROL && piece !== "")
      .map(([id, piece]) => ({ piece, id }))
      .sort((a, b) => b.piece.length - a.piece.length);
    const parts: (string | number)[] = [];
    let rest = text;
    for (;;) {
      let best: { at: number; piece: string; id: number } | undefined;
      for (const s of this.#specials) {
        const at = rest.indexOf(s.piece);
        if (at >= 0 && (best === undefined || at < best.at)) best = { at, ...s };
      }
      if (!best) break;
      parts.push(rest.slice(0, best.at), best.id);
      rest = rest.slice(best.at + best.piece.length);
    }
    parts.push(rest);
    return parts;
  }

  /** Decodes a whole id sequence; control tokens vanish and a space after BOS is dropped, as in run.c. */
  decode(ids: readonly number[], opts: DecodeOptions = {}): string {
    const parts: Uint8Array[] = [];
    let total = 0;
    let afterBos = opts.afterBos ?? false;
    for (const id of ids) {
      const bytes = this.#tokenBytes(id, afterBos);
      afterBos = id === this.bosId;
      parts.push(bytes);
      total += bytes.byteLength;
    }
    const all = new Uint8Array(total);
    let offset = 0;
    for (const p of parts) {
      all.set(p, offset);
      offset += p.byteLength;
    }
    return new TextDecoder("utf-8", { ignoreBOM: true }).decode(all);
  }

  /**
   * A decoder for streamed tokens: each push returns only complete characters, so a
   * character spread over several `<0xXX>` tokens appears once its last byte arrives.
   */
  createDecoder(opts: DecodeOptions = {}): IncrementalDecoder {
    // WHATWG streaming decode holds back an incomplete trailing sequence and yields exactly
    // what a one-shot decode of the same bytes would, which is the guarantee we need.
    const utf8 = new TextDecoder("utf-8", { ignoreBOM: true });
    let afterBos = opts.afterBos ?? false;
    return {
      push: (id: number): string => {
        const bytes = this.#tokenBytes(id, afterBos);
        afterBos = id === this.bosId;
        return utf8.decode(bytes, { stream: true });
      },
      flush: (): string => {
        afterBos = false;
        return utf8.decode();
      },
    };
  }

  /** The piece of a token as the vocabulary spells it, with spaces as " ", for logs and debugging. */
  tokenText(id: number): string {
    this.#checkId(id);
    return this.#pieces[id]!;
  }

  #checkId(id: number): void {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
      throw new RangeError(
        `Cannot decode token id ${id}: the vocabulary has ids 0..${this.vocabSize - 1}`,
      );
    }
  }

  #tokenBytes(id: number, afterBos: boolean): Uint8Array {
    this.#checkId(id);
    if (this.#types[id] === TYPE_CONTROL) return EMPTY;
    const byte = this.#byteOf[id]!;
    if (byte >= 0) return BYTES[byte]!;
    let bytes = this.#pieceBytes[id];
    if (!bytes) {
      bytes = ENCODER.encode(this.#pieces[id]!);
      this.#pieceBytes[id] = bytes;
    }
    // run.c checks the piece text, so a byte token <0x20> after BOS keeps its space.
    return afterBos && bytes[0] === 0x20 ? bytes.subarray(1) : bytes;
  }

  #pushSymbol(symbol: string, ids: number[]): void {
    const id = this.#lookup.get(symbol);
    if (id !== undefined) {
      ids.push(id);
      return;
    }
    for (const b of ENCODER.encode(symbol)) {
      const byteId = this.#byteToken[b]!;
      if (byteId >= 0) ids.push(byteId);
      else if (this.#unknownId >= 0) ids.push(this.#unknownId);
      else {
        throw new Error(
          `Cannot encode ${
            JSON.stringify(symbol)
          }: the vocabulary has neither this piece nor a byte token <0x${
            hex2(b)
          }>, and no unknown token`,
        );
      }
    }
  }

  /**
   * Greedy BPE merging with a heap over a linked list: O(n log n), yet it picks the same pair
   * as run.c's full rescan each round (highest score, then leftmost), because list nodes keep
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
    const heap = new PairHeap();
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

/** Max-heap on score; among equal scores the leftmost pair comes first, as in run.c's scan. */
class PairHeap {
  readonly #items: PairEntry[] = [];

  push(e: PairEntry): void {
    const a = this.#items;
    a.push(e);
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!before(a[i]!, a[p]!)) break;
      [a[i], a[p]] = [a[p]!, a[i]!];
      i = p;
    }
  }

  pop(): PairEntry | undefined {
    const a = this.#items;
    const top = a[0];
    const last = a.pop();
    if (a.length > 0 && last) {
      a[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let best = i;
        if (l < a.length && before(a[l]!, a[best]!)) best = l;
        if (r < a.length && before(a[r]!, a[best]!)) best = r;
        if (best === i) break;
        [a[i], a[best]] = [a[best]!, a[i]!];
        i = best;
      }
    }
    return top;
  }
}

function before(x: PairEntry, y: PairEntry): boolean {
  return x.score > y.score || (x.score === y.score && x.left < y.left);
}

/** Without token types (llama2.c files), recognise the special pieces the way llama.cpp's converter does. */
function inferType(id: number, piece: string, data: TokenizerData): number {
  if (id === data.bosId || id === data.eosId) return TYPE_CONTROL;
  if (BYTE_PIECE.test(piece)) return TYPE_BYTE;
  if (piece === "<unk>") return TYPE_UNKNOWN;
  return TYPE_NORMAL;
}

function hex2(b: number): string {
  return b.toString(16).toUpperCase().padStart(2, "0");
}

const ENCODER = new TextEncoder();
const EMPTY = new Uint8Array(0);
const BYTES = Array.from({ length: 256 }, (_, b) => Uint8Array.of(b));
