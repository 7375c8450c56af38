import type { GenerationBackend } from "../core/generation.ts";

/** The text methods of a GenerationBackend. */
export type TextMethods = Pick<
  GenerationBackend,
  "countTokens" | "tokenize" | "detokenize" | "tokenPiece"
>;

/**
 * A GenerationBackend's text methods, answered by `text`: the server's and the router's
 * backends (CoreBackend, RouterBackend) hand them to their PromptTokens, so both count,
 * tokenize and detokenize one way; CachedBackend hands them to the backend it wraps.
 */
export abstract class DelegatedText<T extends TextMethods> implements TextMethods {
  constructor(protected readonly text: T) {}

  countTokens(text: string, opts: { special?: boolean } = {}): number {
    return this.text.countTokens(text, opts);
  }

  tokenize(text: string, opts: { bos: boolean; special: boolean }): number[] {
    return this.text.tokenize(text, opts);
  }

  detokenize(ids: readonly number[]): string {
    return this.text.detokenize(ids);
  }

  tokenPiece(id: number): string {
    return this.text.tokenPiece(id);
  }
}
