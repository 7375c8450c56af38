import type { Tokenizer } from "../tokenizer/tokenizer.ts";

/**
 * The text side of a GenerationBackend: how a prompt becomes ids and ids become text. A prompt
 * gets BOS (and EOS) as the vocabulary adds them; chat-template text goes through
 * Tokenizer.encodeTemplate (one BOS even when the template writes it). A client's own prompt
 * text is never cut: "<s>" there is characters. The server and the router (which holds only
 * the vocabulary) share it, so both count and send the same ids.
 */
export class PromptTokens {
  readonly bosToken: string;
  readonly eosToken: string;
  readonly vocabSize: number;
  readonly specialTokens: readonly string[];

  constructor(readonly tokenizer: Tokenizer) {
    this.bosToken = tokenizer.tokenText(tokenizer.bosId);
    this.eosToken = tokenizer.tokenText(tokenizer.eosId);
    this.vocabSize = tokenizer.vocabSize;
    this.specialTokens = tokenizer.specialPieces;
  }

  /** A prompt's ids: BOS (and EOS) as the vocabulary adds them; `special`: template text. */
  encode(text: string, special: boolean): number[] {
    return special ? this.tokenizer.encodeTemplate(text) : this.tokenizer.encode(text);
  }

  /** UTF-8 bytes of the longest token's text: no token covers more input than that. */
  #maxPieceBytes?: number;

  minTokens(text: string): number {
    if (this.#maxPieceBytes === undefined) {
      const enc = new TextEncoder();
      let max = 1;
      for (let id = 0; id < this.vocabSize; id++) {
        max = Math.max(max, enc.encode(this.tokenizer.tokenText(id)).byteLength);
      }
      this.#maxPieceBytes = max;
    }
    // A UTF-16 unit is at most 3 UTF-8 bytes and at least 1: text.length is a lower bound on
    // the bytes without encoding the text.
    return Math.floor(text.length / this.#maxPieceBytes);
  }

  countTokens(text: string, opts: { special?: boolean } = {}): number {
    return this.encode(text, opts.special ?? false).length;
  }

  tokenize(text: string, opts: { bos: boolean; special: boolean }): number[] {
    // Control-token text without an added BOS (llama-server's parse_special without
    // add_special): every piece the client typed is a token, a leading "<s>" included. The
    // template path drops that one as the duplicate of the BOS it adds, and it was lost.
    if (opts.special && !opts.bos) {
      return this.tokenizer.encode(text, { special: true, bos: false, eos: false });
    }
    const ids = this.encode(text, opts.special);
    if (opts.bos) return [...ids];
    // encode added what the vocabulary adds to a prompt; nothing of it was asked for.
    const start = this.tokenizer.addBos ? 1 : 0;
    return ids.slice(start, this.tokenizer.addEos ? Math.max(start, ids.length - 1) : ids.length);
  }

  detokenize(ids: readonly number[]): string {
    return this.tokenizer.decode(ids);
  }

  tokenPiece(id: number): string {
    return this.tokenizer.tokenText(id);
  }
}
