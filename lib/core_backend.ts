import type { ServingCore } from "../actors/core.ts";
import type {
  CoreStats,
  GenerationBackend,
  GenerationEvent,
  GenerationRequest,
} from "./generation.ts";
import type { Tokenizer } from "./tokenizer.ts";

/**
 * Presents the serving core to the HTTP layer. Chat templates render the BOS token as text
 * ("<s>"); the core adds BOS itself, so a leading BOS text is dropped here rather than being
 * tokenized as the characters "<", "s", ">".
 */
export class CoreBackend implements GenerationBackend {
  readonly contextLength: number;
  readonly bosToken: string;
  readonly eosToken: string;
  readonly vocabSize: number;

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
  }

  generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent> {
    // Sampling BOS means a new document begins: llama2.c models end their stories that way
    // (run.c stops there too), so it ends the generation like EOS.
    const stopTokenIds = [this.tokenizer.bosId, ...(req.stopTokenIds ?? [])];
    return this.core.generate({ ...req, prompt: this.#stripBos(req.prompt), stopTokenIds }, signal);
  }

  countTokens(text: string, opts: { special?: boolean } = {}): number {
    return this.tokenizer.encode(this.#stripBos(text), { bos: true, special: opts.special }).length;
  }

  stats(): CoreStats {
    return this.core.stats();
  }

  #stripBos<T extends string | readonly number[]>(prompt: T): T {
    if (typeof prompt === "string" && this.bosToken !== "" && prompt.startsWith(this.bosToken)) {
      return prompt.slice(this.bosToken.length) as T;
    }
    return prompt;
  }
}
