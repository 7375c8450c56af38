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

  /**
   * The HTTP layer counts a prompt's tokens (to check the context) right before it generates
   * from it: remembering the last encoding means the prompt is tokenized once, not twice.
   */
  #last?: { text: string; special: boolean; ids: number[] };

  encode(text: string, special: boolean): number[] {
    const last = this.#last;
    if (last !== undefined && last.text === text && last.special === special) return last.ids;
    const ids = special ? this.tokenizer.encodeTemplate(text) : this.tokenizer.encode(text);
    this.#last = { text, special, ids };
    return ids;
  }

  countTokens(text: string, opts: { special?: boolean } = {}): number {
    return this.encode(text, opts.special ?? false).length;
  }

  tokenize(text: string, opts: { bos: boolean; special: boolean }): number[] {
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
