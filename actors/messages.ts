/**
 * Every message the actors exchange, in one place.
 *
 *   RequestActor ──SchedulerMsg──▶ SchedulerActor ──ExecutorMsg──▶ ExecutorActor
 *        ▲                           │    ▲                              │
 *        └──────── SeqEvent ─────────┘    └───────── SchedulerMsg ───────┘
 *                                          (step-result, executor-failed/ready/down)
 */
import type { SamplingParams, StepPlan, StepResult } from "../lib/engine.ts";
import type { FinishReason, GenerationErrorCode, Priority } from "../lib/generation.ts";

/** What a request asks the scheduler to generate. */
export interface SeqSpec {
  readonly seqId: number;
  readonly prompt: readonly number[];
  /** Upper bound on generated tokens (the scheduler also caps it by the context length). */
  readonly maxTokens: number;
  readonly sampling: SamplingParams;
  /** Token ids that end the generation (EOS included by the request actor). */
  readonly stopTokenIds: readonly number[];
  readonly priority: Priority;
}

/** How the scheduler answers one sequence. Never blocks: see SeqEvent for why it stays bounded. */
export type SeqEventSink = (event: SeqEvent) => void;

/** Messages into the scheduler's mailbox. */
export type SchedulerMsg =
  | { readonly type: "submit"; readonly seq: SeqSpec; readonly reply: SeqEventSink }
  /** Stop the sequence and free its blocks at once; answered with finished("cancelled"). */
  | { readonly type: "cancel"; readonly seqId: number }
  /** Like cancel, but nobody is listening: no answer. */
  | { readonly type: "client-gone"; readonly seqId: number }
  | {
    readonly type: "step-result";
    /** The executor incarnation that ran the step; results of a failed one are stale. */
    readonly epoch: number;
    readonly result: StepResult;
    /** From engine.step() call to its result, which overlaps other steps when pipelined. */
    readonly durationMs: number;
  }
  /** The engine of `epoch` failed: its KV cache and in-flight steps are lost; a restart follows. */
  | {
    readonly type: "executor-failed";
    readonly epoch: number;
    readonly error: string;
    /** The step whose execution failed, when known (its sequences are suspects). */
    readonly stepId?: number;
  }
  /** A fresh engine serves plans stamped with `epoch`. */
  | { readonly type: "executor-ready"; readonly epoch: number }
  /** The engine could not be recreated: nothing can run any more. */
  | { readonly type: "executor-down"; readonly error: string }
  /** Ask for a stats snapshot. */
  | { readonly type: "stats"; readonly reply: (stats: SchedulerStats) => void }
  /** Refuse new submissions; running and waiting ones go on. */
  | { readonly type: "drain" };

/**
 * Scheduler → request actor, for one sequence. A sequence gets at most
 * accepted|rejected, scheduled, maxTokens tokens and finished|failed, so a mailbox of
 * capacity maxTokens + 4 never fills and the scheduler never waits on a slow client.
 */
export type SeqEvent =
  | { readonly type: "accepted"; readonly seqId: number; readonly promptTokens: number }
  | {
    readonly type: "rejected";
    readonly seqId: number;
    readonly code: GenerationErrorCode;
    readonly message: string;
  }
  /** First time the sequence entered a step; cachedTokens of its prompt came from the prefix cache. */
  | { readonly type: "scheduled"; readonly seqId: number; readonly cachedTokens: number }
  | {
    readonly type: "token";
    readonly seqId: number;
    readonly token: number;
    readonly logprob: number;
    /** The step that sampled it (tests measure gaps in steps). */
    readonly stepId: number;
  }
  | {
    readonly type: "finished";
    readonly seqId: number;
    readonly reason: FinishReason;
    /** Generated tokens, the stop token included. */
    readonly completionTokens: number;
    /** The EOS or stop id that ended it; not sent as a token event. */
    readonly stopToken?: number;
  }
  | {
    readonly type: "failed";
    readonly seqId: number;
    readonly code: GenerationErrorCode;
    readonly message: string;
  };

/** Messages into a request actor's mailbox: its sequence's events, or its client leaving. */
export type RequestMsg =
  | SeqEvent
  /** The caller aborted (cancel): stop, free, and end with done("cancelled"). */
  | { readonly type: "abort" }
  /** The client sink is gone: stop and free; nothing more can be sent. */
  | { readonly type: "client-gone" };

/** Messages into the executor's mailbox. */
export type ExecutorMsg =
  | {
    readonly type: "step";
    /** The executor incarnation the plan was made for; plans for an older one are dropped. */
    readonly epoch: number;
    readonly plan: StepPlan;
    /** Sequences that ended (or were preempted) since the last message: engine.release() them first. */
    readonly release: readonly number[];
  }
  /** Releases to pass on when no step follows soon. */
  | { readonly type: "release"; readonly epoch: number; readonly release: readonly number[] };

/** The scheduler's state for metrics, /ready and the playground. */
export interface SchedulerStats {
  readonly running: number;
  readonly waiting: number;
  readonly kvBlocksUsed: number;
  readonly kvBlocksFree: number;
  readonly kvBlocksTotal: number;
  readonly kvBlockSize: number;
  readonly prefixHitTokens: number;
  readonly prefixQueryTokens: number;
  readonly prefixHitRate: number;
  readonly evictions: number;
  readonly preemptions: number;
  /** Steps planned so far. */
  readonly steps: number;
  readonly stepsInFlight: number;
  readonly lastBatchSize: number;
  readonly lastBatchTokens: number;
  readonly finished: number;
  readonly executorRestarts: number;
  readonly executorHealthy: boolean;
  readonly draining: boolean;
}
