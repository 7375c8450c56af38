import type { SamplingParams } from "../engine/engine.ts";

/**
 * The contract between the client-facing layer (HTTP, WebSocket) and the serving core
 * (request actor, scheduler, executor). The HTTP layer validates input and renders events;
 * the core turns a request into a stream of events.
 */

export type Priority = "interactive" | "batch";

export interface GenerationRequest {
  /** Already rendered text (chat templates are applied by the HTTP layer), or token ids. */
  readonly prompt: string | readonly number[];
  readonly maxTokens: number;
  readonly sampling: SamplingParams;
  /** Strings that end the generation; the matched text is not emitted. */
  readonly stop: readonly string[];
  readonly stopTokenIds?: readonly number[];
  readonly priority: Priority;
  /** Tracing context or request id for logs. */
  readonly requestId: string;
  /**
   * The prompt was rendered by the model's chat template: text spelling a control token
   * ("</s>", "<|im_start|>") is that token. Never set for text the client wrote directly.
   */
  readonly parseSpecialTokens?: boolean;
  /** Include per-token logprobs in token events. */
  readonly logprobs?: boolean;
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

export type GenerationEvent =
  | { readonly type: "started"; readonly promptTokens: number }
  | {
    readonly type: "token";
    readonly text: string;
    readonly ids: readonly number[];
    readonly logprob: number;
  }
  | {
    readonly type: "done";
    readonly finishReason: FinishReason;
    readonly usage: Usage;
    readonly timings: Timings;
  }
  | { readonly type: "error"; readonly code: GenerationErrorCode; readonly message: string };

export type GenerationErrorCode =
  | "context_length_exceeded"
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
  readonly steps: number;
  readonly lastBatchSize: number;
  readonly executorHealthy: boolean;
}

/**
 * What the HTTP layer needs from the core. generate() yields events until "done" or "error";
 * aborting the signal (client gone, cancel) ends the generation and frees its resources.
 * It rejects synchronously-detectable problems (prompt too long, queue full) as an "error"
 * event as the first event.
 */
export interface GenerationBackend {
  readonly modelName: string;
  readonly contextLength: number;
  generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent>;
  countTokens(text: string, opts?: { special?: boolean }): number;
  /** Token ids run from 0 to vocabSize - 1; prompts given as ids are checked against it. */
  readonly vocabSize?: number;
  /** Chat template source from the model file, if any. */
  readonly chatTemplate?: string;
  readonly bosToken: string;
  readonly eosToken: string;
  stats(): CoreStats;
  /**
   * Why it cannot take work now, for /ready (a router: no replica in rotation). Absent: the
   * executor's health decides.
   */
  readinessProblems?(): string[];
}
