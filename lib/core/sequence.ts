import type { SamplingParams } from "../engine/engine.ts";
import type { Priority } from "./generation.ts";
import { cacheScopeRoot, type KvSeq } from "./block_allocator.ts";
import type { SeqSpec } from "./seq_events.ts";
import {
  hasLogitControls,
  historyDependent,
  type LogitControls,
  PenaltyState,
} from "./logit_controls.ts";
import type { TokenConstraint } from "../grammar/token_constraint.ts";
import type { Pooling } from "../engine/pooling.ts";

export type SeqStatus = "waiting" | "running" | "finished";

/**
 * One generation as the scheduler tracks it. Positions [0, numScheduled) have been sent to the
 * engine; `pending` sampled tokens are still on their way back, so the engine is ahead of
 * `tokens` by that many. A running sequence either has known tokens left to feed
 * (numScheduled < tokens.length, a prefill or a decode of a token already here) or feeds the
 * token it sampled last, which only the engine has yet.
 */
export class Sequence implements KvSeq {
  readonly seqId: number;
  /** Prompt followed by every generated token received so far. */
  readonly tokens: number[];
  readonly promptLen: number;
  /** tokens.length may not exceed this (prompt + max tokens, capped by the context). */
  readonly maxTotal: number;
  readonly sampling: SamplingParams;
  readonly stopTokenIds: ReadonlySet<number>;
  readonly priority: Priority;
  /** Root of its prefix-cache hash chain (its cache scope's). */
  readonly cacheRoot: number | undefined;
  /** An embedding's pooling (SeqSpec.embed): prompt rows only, hidden states out. */
  readonly embed: Pooling | undefined;
  /** Step counter when it arrived, for aging. */
  readonly arrivalStep: number;
  /** FIFO rank among all sequences; a preempted sequence keeps it, so it re-queues ahead of later ones. */
  readonly arrivalOrder: number;
  status: SeqStatus = "waiting";
  numScheduled = 0;
  pending = 0;
  /** Bumped whenever in-flight results for this sequence become stale (preempt, restart). */
  epoch = 0;
  /** Order of the latest admission; preemption picks the most recent. */
  admitOrder = 0;
  /**
   * It has been in a step: it got its "scheduled" event, and the engine may hold state for it
   * (released when it ends). Stays true across preemptions.
   */
  admitted = false;
  /** Steps including it that crashed the engine. */
  faults = 0;
  /** Its client has stopped reading: nothing is planned for it until it catches up. */
  held = false;
  /** Its logit bias and penalty counts, when it has any. */
  readonly penalties: PenaltyState | undefined;
  /**
   * Its penalties count every token so far, so it is never decoded from a token still on its
   * way back (no `useLastSampled`): each of its decodes waits for the step before.
   */
  readonly needsKnownTokens: boolean;
  /** Alternatives each sampled row returns (0: none). */
  readonly topLogprobs: number;
  /** Its grammar state, for constrained decoding (see scheduler.ts, refreshMasks). */
  readonly constraint: TokenConstraint | undefined;
  /**
   * The ids its next sample may take, under `constraint`; undefined while the grammar has not
   * yet seen the last sampled token (the sequence cannot sample until it has).
   */
  mask: Uint32Array | undefined;
  /**
   * A step in flight samples under a mask not known when it was planned (its input is the
   * token sampled before it): resolved with the mask once the grammar has seen that token.
   */
  late:
    | { readonly promise: Promise<Uint32Array>; readonly resolve: (m: Uint32Array) => void }
    | undefined;

  constructor(init: {
    seqId: number;
    prompt: readonly number[];
    maxTotal: number;
    sampling: SamplingParams;
    stopTokenIds: readonly number[];
    priority: Priority;
    cacheRoot?: number;
    arrivalStep: number;
    arrivalOrder: number;
    controls?: LogitControls;
    /** The prompt's last `generated` ids count as output (failover). */
    generated?: number;
    topLogprobs?: number;
    constraint?: TokenConstraint;
    embed?: Pooling;
  }) {
    this.seqId = init.seqId;
    this.tokens = [...init.prompt];
    this.promptLen = init.prompt.length;
    this.maxTotal = init.maxTotal;
    this.sampling = init.sampling;
    this.stopTokenIds = new Set(init.stopTokenIds);
    this.priority = init.priority;
    this.cacheRoot = init.cacheRoot;
    this.embed = init.embed;
    this.arrivalStep = init.arrivalStep;
    this.arrivalOrder = init.arrivalOrder;
    const c = init.controls;
    this.penalties = c === undefined ? undefined : new PenaltyState(
      c,
      init.prompt,
      init.prompt.length - (init.generated ?? 0),
      init.stopTokenIds,
    );
    this.needsKnownTokens = historyDependent(c);
    this.topLogprobs = init.topLogprobs ?? 0;
    this.constraint = init.constraint;
  }

  /**
   * The sequence a submission asks for: at most `maxTotal` tokens in all (the prompt plus
   * maxTokens, capped by what the context holds), arriving at step `arrivalStep` as the
   * `arrivalOrder`th.
   */
  static fromSpec(
    spec: SeqSpec,
    maxTotal: number,
    arrivalStep: number,
    arrivalOrder: number,
  ): Sequence {
    return new Sequence({
      seqId: spec.seqId,
      prompt: spec.prompt,
      maxTotal,
      sampling: spec.sampling,
      stopTokenIds: spec.stopTokenIds,
      priority: spec.priority,
      cacheRoot: spec.cacheScope ? cacheScopeRoot(spec.cacheScope) : undefined,
      controls: hasLogitControls(spec.controls) ? spec.controls : undefined,
      generated: spec.generated,
      topLogprobs: spec.topLogprobs,
      arrivalStep,
      arrivalOrder,
      constraint: spec.constraint,
      embed: spec.embed,
    });
  }

  /** An embedding's blocks stay out of the prefix cache (KvSeq.uncached). */
  get uncached(): boolean {
    return this.embed !== undefined;
  }

  /** Appends a token it sampled. */
  pushToken(token: number): void {
    this.tokens.push(token);
    this.penalties?.push(token);
  }

  get numGenerated(): number {
    return this.tokens.length - this.promptLen;
  }

  /** Known tokens not yet sent to the engine. */
  get unfed(): number {
    return this.tokens.length - this.numScheduled;
  }

  /** Whether another sampled token may be asked for without overrunning the length limits. */
  get canSample(): boolean {
    return this.tokens.length + this.pending < this.maxTotal;
  }
}
