import type { GenerationBackend } from "../core/generation.ts";
import type { PromptTokens } from "./prompt_tokens.ts";

/**
 * The text methods of a GenerationBackend, answered by PromptTokens: the server's backend
 * (CoreBackend) and the router's (RouterBackend) extend it, so both count, tokenize and
 * detokenize one way.
 */
export abstract class PromptTextBackend
  implements Pick<GenerationBackend, "countTokens" | "tokenize" | "detokenize" | "tokenPiece"> {
  constructor(protected readonly prompts: PromptTokens) {}

  countTokens(text: string, opts: { special?: boolean } = {}): number {
    return this.prompts.countTokens(text, opts);
  }

  tokenize(text: string, opts: { bos: boolean; special: boolean }): number[] {
    return this.prompts.tokenize(text, opts);
  }

  detokenize(ids: readonly number[]): string {
    return this.prompts.detokenize(ids);
  }

  tokenPiece(id: number): string {
    return this.prompts.tokenPiece(id);
  }
}
