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

/** Presents the serving core to the HTTP layer; prompts are encoded as PromptTokens says. */
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
    private readonly tokenizer: Tokenizer,
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
    // Sampling BOS means a new document begins: llama2.c models end their stories that way
    // (run.c stops there too), so it ends the generation like EOS (and, like EOS, not with
    // ignore_eos).
    const stopTokenIds = req.ignoreEos
      ? [...(req.stopTokenIds ?? [])]
      : [this.tokenizer.bosId, ...(req.stopTokenIds ?? [])];
    const prompt = typeof req.prompt === "string"
      ? this.#text.encode(req.prompt, req.parseSpecialTokens ?? false)
      : req.prompt;
    return this.core.generate({ ...req, prompt, stopTokenIds }, signal);
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
