import type { SamplingParams } from "../engine/engine.ts";
import type { LogitControls } from "./logit_controls.ts";
import type { TopLogprobs } from "../engine/top_logprobs.ts";
import type { OutputConstraint } from "../grammar/output_constraint.ts";
import type { Embedder } from "./embedder.ts";
import type { SimilarCacheStats } from "./similar_cache.ts";
import type { SharedResultStoreStats } from "./shared_result_store.ts";

/**
 * The contract between the client-facing layer (HTTP, WebSocket) and the serving core
 * (request actor, scheduler, executor). The HTTP layer validates input and renders events;
 * the core turns a request into a stream of events.
 */

export type Priority = "interactive" | "batch";

export interface GenerationRequest {
  /**
   * The prompt's token ids, with what the vocabulary adds to a prompt (BOS): the edge tokenizes
   * once (lib/http/generation_request.ts), and nothing below it sees text.
   */
  readonly prompt: readonly number[];
  readonly maxTokens: number;
  readonly sampling: SamplingParams;
  /** Strings that end the generation; the matched text is not emitted. */
  readonly stop: readonly string[];
  readonly stopTokenIds?: readonly number[];
  /** The end-of-generation tokens do not end it (only stopTokenIds, stop strings, the length). */
  readonly ignoreEos?: boolean;
  /** Logit bias, penalties and min_tokens; absent or at their defaults: none. */
  readonly controls?: LogitControls;
  /**
   * The prompt's last `generated` ids were produced by an earlier attempt (a router's
   * failover): the penalties and min_tokens count them as output.
   */
  readonly generated?: number;
  readonly priority: Priority;
  /** Tracing context or request id for logs. */
  readonly requestId: string;
  /** Include per-token logprobs in token events. */
  readonly logprobs?: boolean;
  /** With logprobs: this many most likely alternatives per token (0..20). */
  readonly topLogprobs?: number;
  /**
   * The client fixed everything that decides the tokens (greedy, or an explicit seed), so the
   * same request always gives the same answer and a stored one may be replayed.
   */
  readonly deterministic?: boolean;
  /**
   * Who may share cached work with this request (an opaque id of its API key; "" or absent:
   * everyone). The result cache and the prefix cache answer a request only from work done
   * under the same scope.
   */
  readonly cacheScope?: string;
  /** A chat request's question and its context, for the cache for similar questions. */
  readonly similar?: SimilarQuestion;
  /** The client said `cache: false`: no answer from a cache, exact or similar. */
  readonly noCache?: boolean;
  /** Constrained decoding: every sampled token keeps the output a prefix of this grammar's. */
  readonly constraint?: OutputConstraint;
  /**
   * How many of the prompt's last ids were generated under `constraint` by an earlier attempt
   * (a router's failover resubmission): the grammar reads them before the first sample.
   */
  readonly constraintReplay?: number;
}

export type FinishReason = "stop" | "length" | "cancelled";

export interface Usage {
  readonly promptTokens: number;
  readonly completionTokens: number;
  /** Prompt tokens whose KV came from the prefix cache. */
  readonly cachedTokens: number;
}

/** Milliseconds, measured by the core. */
export interface Timings {
  readonly queuedMs: number;
  readonly prefillMs: number;
  readonly timeToFirstTokenMs: number;
  readonly decodeMs: number;
  readonly totalMs: number;
  readonly decodeTokensPerSecond: number;
}

/** A done event replayed from the result cache says so, and what generating it cost. */
export interface CacheHit {
  /** Wall time the original generation took (what the replay saved). */
  readonly savedMs: number;
  /** The answer of a similar question, not of this one (the cache for similar questions). */
  readonly similar?: SimilarHit;
}

/** Which cached question answered a similar one, and how close they were. */
export interface SimilarHit {
  /** Cosine similarity of the two questions' embeddings. */
  readonly score: number;
  /** The first 80 characters of the cached question. */
  readonly matched: string;
}

/**
 * A chat request the cache for similar questions may answer: its last user message, and
 * everything else that decides the answer besides the sampling fields (the conversation
 * before it, tools, template variables), as one string that must match exactly.
 */
export interface SimilarQuestion {
  readonly context: string;
  readonly question: string;
}

export type GenerationEvent =
  | { readonly type: "started"; readonly promptTokens: number }
  | {
    readonly type: "token";
    readonly text: string;
    readonly ids: readonly number[];
    readonly logprob: number;
    /**
     * With topLogprobs: the alternatives at the first id's position (an event holds several
     * ids only when a character's bytes span tokens).
     */
    readonly top?: TopLogprobs;
  }
  | {
    readonly type: "done";
    readonly finishReason: FinishReason;
    readonly usage: Usage;
    readonly timings: Timings;
    /** With finish reason "stop": the stop string that ended it (absent for an end token). */
    readonly stopString?: string;
    /** Present when the answer came from the result cache. */
    readonly cached?: CacheHit;
  }
  | { readonly type: "error"; readonly code: GenerationErrorCode; readonly message: string };

export type GenerationErrorCode =
  | "context_length_exceeded"
  /** The request cannot be served as asked (a schema or grammar that does not compile). */
  | "invalid_request"
  /** Too large to pass on (a router's request over the NATS server's max_payload). */
  | "payload_too_large"
  | "overloaded"
  | "draining"
  | "internal";

/** A snapshot of the core's state for /metrics, /ready and the playground. */
export interface CoreStats {
  readonly running: number;
  readonly waiting: number;
  readonly kvBlocksUsed: number;
  readonly kvBlocksTotal: number;
  readonly prefixCacheHitRate: number;
  /** Absent where no steps run here (a router): unknown, which 0 would misstate. */
  readonly steps?: number;
  /** Sequences in the last step; absent where no steps run here. */
  readonly lastBatchSize?: number;
  readonly executorHealthy: boolean;
  /** Steps the scheduler keeps in flight now (adapted to the step's cost on WebGPU). */
  readonly pipelineDepth?: number;
  /** Present when a result cache is configured. */
  readonly resultCache?: ResultCacheStats;
}

export interface ResultCacheStats {
  readonly hits: number;
  readonly misses: number;
  readonly bytes: number;
  readonly capacityBytes: number;
  readonly entries: number;
  /** Sum of the saved generations' wall time. */
  readonly savedMs: number;
  /** Present when the cache for similar questions is on. */
  readonly similar?: SimilarCacheStats;
  /** Present when a shared store backs it (the replicas behind a router). */
  readonly shared?: SharedResultStoreStats;
}

/**
 * What the HTTP layer needs from the core. generate() yields events until "done" or "error";
 * aborting the signal (client gone, cancel) ends the generation and frees its resources.
 * It rejects synchronously-detectable problems (prompt too long, queue full) as an "error"
 * event as the first event.
 */
/**
 * A model's own defaults for the sampling fields a request leaves out (its entry in the
 * server's models file), in place of the server's (temperature 1, no cuts).
 */
export interface SamplingDefaults {
  readonly temperature?: number;
  readonly topK?: number;
  readonly topP?: number;
  readonly minP?: number;
}

export interface GenerationBackend {
  readonly modelName: string;
  readonly contextLength: number;
  /** What a request that names no temperature, top_k, top_p or min_p gets. */
  readonly samplingDefaults?: SamplingDefaults;
  /** Embeddings (/v1/embeddings); absent where the engine returns no hidden states. */
  readonly embedder?: Embedder;
  /**
   * The prompt /v1/rerank asks in (lib/core/rerank_prompt.ts): --rerank-prompt or the file's;
   * absent: Qwen3-Reranker's.
   */
  readonly rerankPrompt?: string;
  generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent>;
  countTokens(text: string, opts?: { special?: boolean }): number;
  /**
   * A lower bound on countTokens(text) that costs no tokenizing (the text's UTF-8 length over
   * the longest token's), so a prompt that cannot fit the context is refused without encoding
   * it: a megabyte of text takes the tokenizer long enough to stall every stream.
   */
  minTokens?(text: string): number;
  /**
   * The ids a text becomes. `bos`: with the special tokens the vocabulary adds to a prompt
   * (BOS where add_bos_token, as a generation does; llama-server's add_special); `special`
   * reads control-token text as those tokens (what a rendered chat template needs).
   */
  tokenize(text: string, opts: { bos: boolean; special: boolean }): number[];
  /** The text of an id sequence (control tokens vanish). Throws RangeError for a bad id. */
  detokenize(ids: readonly number[]): string;
  /** The vocabulary's spelling of one id (with spaces as " "). */
  tokenPiece(id: number): string;
  /** Token ids run from 0 to vocabSize - 1; prompts given as ids are checked against it. */
  readonly vocabSize?: number;
  /** Chat template source from the model file, if any. */
  readonly chatTemplate?: string;
  readonly bosToken: string;
  readonly eosToken: string;
  /** Spellings of the tokens only template text may produce (control, user-defined): the chat renderer keeps client text from spelling them. */
  readonly specialTokens: readonly string[];
  stats(): CoreStats;
  /**
   * Why it cannot take work now, for /ready (a router: no replica in rotation). Absent: the
   * executor's health decides.
   */
  readinessProblems?(): string[];
}
