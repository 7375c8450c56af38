import type { ServingCore } from "../../actors/core.ts";
import type {
  CoreStats,
  GenerationBackend,
  GenerationEvent,
  GenerationRequest,
  SamplingDefaults,
} from "../core/generation.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import { PromptTokens } from "./prompt_tokens.ts";

/**
 * Presents the serving core to the HTTP layer: requests go to it as they are (ids, built by
 * lib/http/generation_request.ts); text is encoded as PromptTokens says.
 */
export class CoreBackend implements GenerationBackend {
  readonly contextLength: number;
  readonly bosToken: string;
  readonly eosToken: string;
  readonly vocabSize: number;
  readonly specialTokens: readonly string[];
  readonly #text: PromptTokens;

  constructor(
    readonly modelName: string,
    private readonly core: ServingCore,
    tokenizer: Tokenizer,
    readonly chatTemplate?: string,
    readonly samplingDefaults?: SamplingDefaults,
  ) {
    this.contextLength = core.contextLength;
    this.bosToken = tokenizer.tokenText(tokenizer.bosId);
    this.eosToken = tokenizer.tokenText(tokenizer.eosId);
    this.vocabSize = tokenizer.vocabSize;
    this.specialTokens = tokenizer.specialPieces;
    this.#text = new PromptTokens(tokenizer);
  }

  generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent> {
    return this.core.generate(req, signal);
  }

  minTokens(text: string): number {
    return this.#text.minTokens(text);
  }

  countTokens(text: string, opts: { special?: boolean } = {}): number {
    return this.#text.countTokens(text, opts);
  }

  tokenize(text: string, opts: { bos: boolean; special: boolean }): number[] {
    return this.#text.tokenize(text, opts);
  }

  detokenize(ids: readonly number[]): string {
    return this.#text.detokenize(ids);
  }

  tokenPiece(id: number): string {
    return this.#text.tokenPiece(id);
  }

  stats(): CoreStats {
    return this.core.stats();
  }
}
