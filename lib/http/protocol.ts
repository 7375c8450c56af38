import type { CoreStats, FinishReason, Timings, Usage } from "../core/generation.ts";
import type { ApiError } from "./errors.ts";

/**
 * Frames the server sends on `GET /v1/stream` (JSON text frames). Field names are snake_case
 * like the client frames and the OpenAI API.
 */
export type ServerFrame =
  | StartedFrame
  | TokenFrame
  | DoneFrame
  | ErrorFrame
  | StatsFrame
  | LoadingFrame;

/**
 * Sent by a server of several models on a socket whose model is not loaded yet, at once and
 * every half second until it is (then the socket serves as usual; client frames sent
 * meanwhile are answered after the load). A load that fails ends with an error frame
 * (`model_load_failed`, `insufficient_memory`) and a close with 1011.
 */
export interface LoadingFrame {
  readonly type: "loading";
  readonly model: string;
  /** Bytes of the model file read so far, and its size when known. */
  readonly bytes: number;
  readonly total_bytes?: number;
  readonly elapsed_s: number;
}

export interface StartedFrame {
  readonly type: "started";
  readonly id: string;
  readonly prompt_tokens: number;
  /** max_tokens after capping to the context. */
  readonly max_tokens: number;
  /** True when the context had less room than the max_tokens asked for. */
  readonly max_tokens_capped: boolean;
}

export interface TokenFrame {
  readonly type: "token";
  readonly id: string;
  /** Text delta; may be "" while a multi-byte character is incomplete. */
  readonly text: string;
  readonly token_ids: readonly number[];
  /** Natural-log probability, present when the generate frame asked for logprobs. */
  readonly logprob?: number;
}

export interface UsageJson {
  readonly prompt_tokens: number;
  readonly completion_tokens: number;
  readonly total_tokens: number;
  /** Absent where it is not known (a cancel the backend did not answer with its own usage). */
  readonly cached_tokens?: number;
}

export interface TimingsJson {
  readonly queued_ms: number;
  readonly prefill_ms: number;
  readonly ttft_ms: number;
  readonly decode_ms: number;
  readonly total_ms: number;
  readonly decode_tokens_per_second: number;
}

export interface DoneFrame {
  readonly type: "done";
  readonly id: string;
  readonly finish_reason: FinishReason;
  readonly usage: UsageJson;
  readonly timings: TimingsJson | null;
  /** True when max_tokens was lowered to what the context had left. */
  readonly max_tokens_capped: boolean;
  /** True when the answer was replayed from the result cache. */
  readonly cached: boolean;
  /** With `cached`: the wall time the original generation took. */
  readonly saved_ms?: number;
}

export interface ErrorFrame {
  readonly type: "error";
  /** The generation it concerns, when known (absent for unparseable frames). */
  readonly id?: string;
  readonly code: string;
  readonly message: string;
  /** Path of the offending field, e.g. "messages[0].role". */
  readonly param?: string;
}

export interface StatsFrame {
  readonly type: "stats";
  readonly running: number;
  readonly waiting: number;
  /** Absent where no steps run (a router), as is `steps`. */
  readonly batch_size?: number;
  readonly kv_blocks_used: number;
  readonly kv_blocks_total: number;
  readonly prefix_cache_hit_rate: number;
  readonly steps?: number;
  readonly executor_healthy: boolean;
  readonly inflight: number;
  /** Present when a result cache is configured. */
  readonly result_cache?: {
    readonly hits: number;
    readonly misses: number;
    readonly entries: number;
    readonly bytes: number;
  };
}

export function usageJson(u: Usage): UsageJson {
  return {
    prompt_tokens: u.promptTokens,
    completion_tokens: u.completionTokens,
    total_tokens: u.promptTokens + u.completionTokens,
    cached_tokens: u.cachedTokens,
  };
}

export const round = (ms: number) => Math.round(ms * 1000) / 1000;

export function timingsJson(t: Timings): TimingsJson {
  return {
    queued_ms: round(t.queuedMs),
    prefill_ms: round(t.prefillMs),
    ttft_ms: round(t.timeToFirstTokenMs),
    decode_ms: round(t.decodeMs),
    total_ms: round(t.totalMs),
    decode_tokens_per_second: round(t.decodeTokensPerSecond),
  };
}

export function errorFrame(err: ApiError, id?: string): ErrorFrame {
  return {
    type: "error",
    ...(id !== undefined ? { id } : {}),
    code: err.code,
    message: err.message,
    ...(err.param !== null ? { param: err.param } : {}),
  };
}

export function statsFrame(s: CoreStats, inflight: number): StatsFrame {
  return {
    type: "stats",
    running: s.running,
    waiting: s.waiting,
    ...(s.lastBatchSize === undefined ? {} : { batch_size: s.lastBatchSize }),
    kv_blocks_used: s.kvBlocksUsed,
    kv_blocks_total: s.kvBlocksTotal,
    prefix_cache_hit_rate: s.prefixCacheHitRate,
    ...(s.steps === undefined ? {} : { steps: s.steps }),
    executor_healthy: s.executorHealthy,
    inflight,
    ...(s.resultCache !== undefined
      ? {
        result_cache: {
          hits: s.resultCache.hits,
          misses: s.resultCache.misses,
          entries: s.resultCache.entries,
          bytes: s.resultCache.bytes,
        },
      }
      : {}),
  };
}
