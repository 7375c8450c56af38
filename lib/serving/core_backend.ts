import type { ServingCore } from "../../actors/core.ts";
import type {
  CoreStats,
  GenerationBackend,
  GenerationEvent,
  GenerationRequest,
} from "../core/generation.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";

/**
 * Presents the serving core to the HTTP layer. A prompt gets BOS (and EOS) as the vocabulary
 * adds them; chat-template text goes through Tokenizer.encodeTemplate (one BOS even when the
 * template writes it). A client's own prompt text is never cut: "<s>" there is characters.
 */
export class CoreBackend implements GenerationBackend {
  readonly contextLength: number;
  readonly bosToken: string;
  readonly eosToken: string;
  readonly vocabSize: number;
  readonly specialTokens: readonly string[];

  constructor(
    readonly modelName: string,
    private readonly core: ServingCore,
    private readonly tokenizer: Tokenizer,
    readonly chatTemplate?: string,
  ) {
    this.contextLength = core.contextLength;
    this.bosToken = tokenizer.tokenText(tokenizer.bosId);
    this.eosToken = tokenizer.tokenText(tokenizer.eosId);
    this.vocabSize = tokenizer.vocabSize;
    this.specialTokens = tokenizer.specialPieces;
  }

  generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent> {
    // Sampling BOS means a new document begins: llama2.c models end their stories that way
    // (run.c stops there too), so it ends the generation like EOS.
    const stopTokenIds = [this.tokenizer.bosId, ...(req.stopTokenIds ?? [])];
    const prompt = typeof req.prompt === "string"
      ? this.#encode(req.prompt, req.parseSpecialTokens ?? false)
      : req.prompt;
    return this.core.generate({ ...req, prompt, stopTokenIds }, signal);
  }

  countTokens(text: string, opts: { special?: boolean } = {}): number {
    return this.#encode(text, opts.special ?? false).length;
  }

  tokenize(text: string, opts: { bos: boolean; special: boolean }): number[] {
    const ids = this.#encode(text, opts.special);
    if (opts.bos) return [...ids];
    // #encode added what the vocabulary adds to a prompt; nothing of it was asked for.
    const start = this.tokenizer.addBos ? 1 : 0;
    return ids.slice(start, this.tokenizer.addEos ? Math.max(start, ids.length - 1) : ids.length);
  }

  detokenize(ids: readonly number[]): string {
    return this.tokenizer.decode(ids);
  }

  tokenPiece(id: number): string {
    return this.tokenizer.tokenText(id);
  }

  stats(): CoreStats {
    return this.core.stats();
  }

  /**
   * The HTTP layer counts a prompt's tokens (to check the context) right before it generates
   * from it: remembering the last encoding means the prompt is tokenized once, not twice.
   */
  #last?: { text: string; special: boolean; ids: number[] };

  #encode(text: string, special: boolean): number[] {
    const last = this.#last;
    if (last !== undefined && last.text === text && last.special === special) return last.ids;
    const ids = special ? this.tokenizer.encodeTemplate(text) : this.tokenizer.encode(text);
    this.#last = { text, special, ids };
    return ids;
  }
}
