/**
 * Every message the actors exchange, in one place.
 *
 *   RequestActor ──SchedulerMsg──▶ SchedulerActor ──ExecutorMsg──▶ ExecutorActor
 *        ▲                           │    ▲                              │
 *        └──────── SeqEvent ─────────┘    └───────── SchedulerMsg ───────┘
 *                                          (step-result, executor-failed/ready/down)
 */
import type { StepPlan, StepResult } from "../lib/engine/engine.ts";
import type { SchedulerStats, SeqEvent, SeqEventSink, SeqSpec } from "../lib/core/seq_events.ts";

export type { SchedulerStats, SeqEvent, SeqEventSink, SeqSpec };

/** Messages into the scheduler's mailbox. */
export type SchedulerMsg =
  | { readonly type: "submit"; readonly seq: SeqSpec; readonly reply: SeqEventSink }
  /** Stop the sequence and free its blocks at once; answered with finished("cancelled"). */
  | { readonly type: "cancel"; readonly seqId: number }
  /** Like cancel, but nobody is listening: no answer. */
  | { readonly type: "client-gone"; readonly seqId: number }
  /**
   * The sequence's client has stopped reading: decode nothing more for it (its KV stays)
   * until "resume". A slow reader then costs the engine nothing.
   */
  | { readonly type: "hold"; readonly seqId: number }
  | { readonly type: "resume"; readonly seqId: number }
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
  /** Publish the prefix cache's hashes for SchedulerActor.cachedBlockHashes's next caller. */
  | { readonly type: "publish-hashes"; readonly limit: number }
  /** The pause between paced background steps is over (SchedulerActorOptions.backgroundShare). */
  | { readonly type: "wake" }
  /** Refuse new submissions; running and waiting ones go on. */
  | { readonly type: "drain" };

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
