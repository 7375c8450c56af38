/**
 * What the scheduler says to a sequence's owner and what it reports about itself. They live
 * in the core (not in actors/) because the scheduler policy produces them; actors/messages.ts
 * re-exports them beside the actor mailboxes.
 */
import type { SamplingParams } from "../engine/engine.ts";
import type { FinishReason, GenerationErrorCode, Priority } from "./generation.ts";
import type { LogitControls } from "./logit_controls.ts";
import type { TopLogprobs } from "../engine/top_logprobs.ts";
import type { TokenConstraint } from "../grammar/token_constraint.ts";
import type { HiddenStates } from "../engine/engine.ts";
import type { Pooling } from "../engine/pooling.ts";

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
  /** Its prefix-cache scope (GenerationRequest.cacheScope). */
  readonly cacheScope?: string;
  /** Logit bias, penalties and min_tokens (GenerationRequest.controls). */
  readonly controls?: LogitControls;
  /** The prompt's last `generated` ids are output of an earlier attempt (failover). */
  readonly generated?: number;
  /** Alternatives to return with each sampled token (0..20). */
  readonly topLogprobs?: number;
  /**
   * Constrained decoding: the grammar state the sampled tokens must follow. The scheduler owns
   * it from submit() on and disposes of it when the sequence ends (or is refused).
   */
  readonly constraint?: TokenConstraint;
  /**
   * An embedding: the prompt is computed and nothing is generated. Its hidden states come back
   * as "hidden" events (the rows `embed` pooling needs), then "finished"; its KV blocks never
   * enter the prefix cache and it takes none from it (every row is computed).
   */
  readonly embed?: Pooling;
}

/** How the scheduler answers one sequence. Never blocks: see SeqEvent for why it stays bounded. */
export type SeqEventSink = (event: SeqEvent) => void;

/**
 * Events a sequence gets besides its tokens: accepted|rejected, scheduled, finished|failed.
 * With at most maxTokens token events, a mailbox of maxTokens + SEQ_EVENTS_BESIDE_TOKENS
 * never fills, so the scheduler never waits on a slow client (actors/request.ts sizes its
 * mailbox from this).
 */
export const SEQ_EVENTS_BESIDE_TOKENS = 3;

/** Scheduler → request actor, for one sequence (at most maxTokens + SEQ_EVENTS_BESIDE_TOKENS). */
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
    /** With SeqSpec.topLogprobs: the most likely tokens at its position. */
    readonly top?: TopLogprobs;
    /** The step that sampled it (tests measure gaps in steps). */
    readonly stepId: number;
  }
  /** Hidden states of an embedding's rows (SeqSpec.embed), in step order. */
  | { readonly type: "hidden"; readonly seqId: number; readonly states: HiddenStates }
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
