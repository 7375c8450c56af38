import { BlockAllocator, cacheScopeRoot } from "./block_allocator.ts";
import { DEFAULT_LIMITS } from "../engine/limits.ts";
import type { SeqInput, StepPlan, StepResult } from "../engine/engine.ts";
import type { FinishReason, GenerationErrorCode } from "./generation.ts";
import { Sequence } from "./sequence.ts";
import { hasLogitControls, logitControlsProblem } from "./logit_controls.ts";
import { isTokenId } from "../engine/step_validation.ts";
import { allowsOnly, tokenMaskProblem } from "../engine/token_mask.ts";
import type { SchedulerStats, SeqEvent, SeqEventSink, SeqSpec } from "./seq_events.ts";

export interface SchedulerConfig {
  /** KV pool geometry: take it from the engine (engine.kv). */
  readonly numBlocks: number;
  readonly blockSize: number;
  /** Longest prompt + completion (engine.config.contextLength). */
  readonly contextLength: number;
  /** Token budget of one step (prefill chunk tokens + one per decode). */
  readonly maxBatchTokens: number;
  /** Most sequences holding KV blocks at once. */
  readonly maxRunning: number;
  /**
   * Most sequences waiting that cannot start at the next step (beyond the free running slots);
   * more submissions are refused as "overloaded".
   */
  readonly maxWaiting: number;
  /** Steps after which a batch request ranks like an interactive one. */
  readonly agingSteps: number;
  /** Free blocks a new admission must leave for the running sequences to grow into. */
  readonly watermarkBlocks: number;
  /**
   * A sequence in this many steps that crashed the engine is failed instead of recomputed
   * again, so one poisonous request cannot keep the engine restarting forever.
   */
  readonly maxSeqFaults: number;
  /** Prompt token ids must be below this (0: unchecked); one bad id would fail a whole step. */
  readonly vocabSize: number;
  readonly prefixCaching: boolean;
  /**
   * The engine takes late token masks (Engine.lateMasks): a constrained sequence then decodes
   * from its token in flight, its mask computed while the step runs.
   */
  readonly lateMasks: boolean;
}

const SCHEDULER_DEFAULTS = {
  maxBatchTokens: DEFAULT_LIMITS.maxBatchTokens,
  maxRunning: DEFAULT_LIMITS.maxRunning,
  maxWaiting: DEFAULT_LIMITS.maxWaiting,
  agingSteps: DEFAULT_LIMITS.agingSteps,
  prefixCaching: true,
  maxSeqFaults: DEFAULT_LIMITS.maxSeqFaults,
  vocabSize: 0,
  lateMasks: false,
} as const;

/** Fills in the defaults (lib/engine/limits.ts); the watermark is a share of the pool. */
export function schedulerConfig(
  required: Pick<SchedulerConfig, "numBlocks" | "blockSize" | "contextLength">,
  overrides: Partial<SchedulerConfig> = {},
): SchedulerConfig {
  const cfg = {
    ...SCHEDULER_DEFAULTS,
    watermarkBlocks: Math.ceil(required.numBlocks * DEFAULT_LIMITS.watermarkFraction),
    ...required,
    ...overrides,
  };
  for (
    const key of [
      "numBlocks",
      "blockSize",
      "contextLength",
      "maxBatchTokens",
      "maxRunning",
    ] as const
  ) {
    if (!Number.isInteger(cfg[key]) || cfg[key] < 1) {
      throw new RangeError(
        `Cannot create scheduler: ${key} must be a positive integer, received ${cfg[key]}`,
      );
    }
  }
  return cfg;
}

interface InFlightStep {
  /** Every sequence in the plan (the suspects if the step crashes the engine). */
  readonly all: Sequence[];
  /** The one repeat suspect allowed in this step: if the step crashes, it alone is blamed. */
  isolated?: Sequence;
  /** The sampling entries of the plan, in plan order... */
  readonly seqs: Sequence[];
  /** ...each with the epoch it was planned under (parallel arrays: no object per entry). */
  readonly epochs: number[];
}

/** The step being built by schedule(). */
interface StepBuild {
  readonly stepId: number;
  readonly entries: SeqInput[];
  readonly record: InFlightStep;
  /** Sequences in the step: never preempted to make room for another. */
  readonly members: Set<Sequence>;
  /**
   * Sequences preempted to make room while building it. They wait for a later step (so a
   * preemption is not undone at once), unless this step would otherwise be empty.
   */
  readonly preempted: Set<Sequence>;
  budget: number;
}

const NO_TOKENS: readonly number[] = Object.freeze([]);

/** Crashed steps after which a sequence runs as the only suspect of its step, to settle blame. */
const ISOLATE_AFTER_FAULTS = 2;

/**
 * The continuous-batching policy as a synchronous state machine (the SchedulerActor drives it).
 * Each schedule() builds one step under the token budget and the sequence cap: single-token
 * decodes first, then prefill chunks, then admissions, highest priority first. KV blocks are
 * allocated lazily per step; when they run out the lowest-priority, most recently admitted
 * sequence is preempted and later recomputed. schedule() may be called again before earlier
 * results come back (pipelining): a decode then feeds "the token sampled last", and tokens
 * sampled past a stop are dropped when they arrive. Plans are checked by the engines
 * (lib/engine/step_validation.ts) and requests by the edge; submit() checks only what would
 * let one request fail a step shared with others.
 */
export class Scheduler {
  readonly config: SchedulerConfig;
  readonly kv: BlockAllocator;
  /** Live sequences (waiting or running). */
  #seqs = new Map<number, Sequence>();
  /** Sorted by arrivalOrder. */
  #waiting: Sequence[] = [];
  /** In admission order. */
  #running: Sequence[] = [];
  #inFlight = new Map<number, InFlightStep>();
  /** Set only while schedule() runs. */
  #build: StepBuild | undefined;
  #nextStepId = 0;
  #arrivals = 0;
  #admissions = 0;
  #preemptions = 0;
  #finished = 0;
  #restarts = 0;
  #lastBatchSize = 0;
  #lastBatchTokens = 0;
  #healthy = true;
  #draining = false;
  /** Ids whose per-sequence engine state can go (ended or preempted), not yet handed over. */
  #released: number[] = [];
  /** Constrained sequences whose next mask is to be computed (refreshMasks). */
  #needMask: Sequence[] = [];

  constructor(config: SchedulerConfig) {
    this.config = config;
    this.kv = new BlockAllocator({
      numBlocks: config.numBlocks,
      blockSize: config.blockSize,
      prefixCaching: config.prefixCaching,
    });
  }

  /** Sequences not yet finished (waiting or running). */
  get numLive(): number {
    return this.#seqs.size;
  }

  get numRunning(): number {
    return this.#running.length;
  }

  get numWaiting(): number {
    return this.#waiting.length;
  }

  get stepsInFlight(): number {
    return this.#inFlight.size;
  }

  /** Stop accepting submissions (graceful shutdown); live sequences go on. */
  drain(): void {
    this.#draining = true;
  }

  /**
   * Queues a sequence. Answers accepted or rejected (prompt too long, queue full, draining)
   * through `reply` before returning.
   */
  submit(spec: SeqSpec, reply: SeqEventSink): void {
    const { seqId, prompt } = spec;
    const problem = this.#refusal(spec);
    if (problem) {
      spec.constraint?.dispose();
      safeReply(reply, { type: "rejected", seqId, ...problem });
      return;
    }
    safeReply(reply, { type: "accepted", seqId, promptTokens: prompt.length });
    if (spec.maxTokens <= 0) {
      spec.constraint?.dispose();
      safeReply(reply, { type: "finished", seqId, reason: "length", completionTokens: 0 });
      this.#finished++;
      return;
    }
    const seq = new Sequence({
      seqId,
      prompt,
      maxTotal: prompt.length + Math.min(spec.maxTokens, this.#promptLimit - prompt.length),
      sampling: spec.sampling,
      stopTokenIds: spec.stopTokenIds,
      priority: spec.priority,
      cacheRoot: spec.cacheScope ? cacheScopeRoot(spec.cacheScope) : undefined,
      controls: hasLogitControls(spec.controls) ? spec.controls : undefined,
      generated: spec.generated,
      topLogprobs: spec.topLogprobs,
      arrivalStep: this.#nextStepId,
      arrivalOrder: this.#arrivals++,
      reply,
      constraint: spec.constraint,
    });
    this.#seqs.set(seqId, seq);
    this.#waiting.push(seq);
    if (seq.constraint) this.#needMask.push(seq);
  }

  /** Whether constrained sequences wait for their next mask (call refreshMasks before schedule). */
  get masksPending(): boolean {
    return this.#needMask.length > 0;
  }

  /**
   * Computes the next token mask of every constrained sequence whose grammar has seen a new
   * token (or none yet). A sequence whose grammar allows nothing but its end finishes here
   * ("stop"): the output is complete. The only asynchronous step of the scheduler, because
   * XGrammar's mask call is; the owning actor awaits it between messages, so nothing else
   * touches the scheduler meanwhile.
   */
  async refreshMasks(): Promise<void> {
    while (this.#needMask.length > 0) {
      const seqs = [...new Set(this.#needMask)].filter((seq) =>
        seq.status !== "finished" && seq.constraint && !seq.mask
      );
      this.#needMask = [];
      // Asked for all at once: a grammar thread answers them in one round trip.
      const masks = await Promise.allSettled(seqs.map((seq) => seq.constraint!.nextMask()));
      for (let i = 0; i < seqs.length; i++) {
        const seq = seqs[i]!, got = masks[i]!;
        if (!seq.constraint) continue;
        if (got.status === "rejected") {
          const e = got.reason;
          if (!ended(seq)) {
            this.#retire(seq, {
              type: "failed",
              seqId: seq.seqId,
              code: "internal",
              message: `Generation failed: the grammar could not give the next tokens (${
                e instanceof Error ? e.message : e
              })`,
            });
          }
          continue;
        }
        const mask = got.value;
        // Cancelled while its mask was computed (the await let other work run).
        if (ended(seq)) continue;
        const vocab = this.config.vocabSize || mask.length * 32;
        if (tokenMaskProblem(mask, vocab) || allowsOnly(mask, seq.constraint.stopIds, vocab)) {
          this.#finish(seq, "stop");
        } else {
          seq.mask = mask;
          // A step in flight already feeds the token this mask follows: it samples under it.
          seq.late?.resolve(mask);
          seq.late = undefined;
        }
      }
    }
  }

  /**
   * Ends a live sequence at once and frees its blocks; results still in flight for it are
   * dropped. Answers finished("cancelled") when `notify`. Unknown ids are ignored (it may have
   * finished meanwhile).
   */
  cancel(seqId: number, notify = true): void {
    const seq = this.#seqs.get(seqId);
    if (!seq) return;
    if (!notify) seq.reply = undefined;
    this.#finish(seq, "cancelled");
  }

  /**
   * Holds (or resumes) a live sequence whose client has stopped reading: a held sequence keeps
   * its place and its KV blocks, but no step decodes, prefills or admits it. Unknown ids are
   * ignored (it may have finished meanwhile).
   */
  hold(seqId: number, held: boolean): void {
    const seq = this.#seqs.get(seqId);
    if (seq) seq.held = held;
  }

  /**
   * Ids of sequences that ended or were preempted since the last call: the engine may drop
   * their per-sequence state (engine.release) before running the next plan.
   */
  takeReleased(): number[] {
    const ids = this.#released;
    this.#released = [];
    return ids;
  }

  /** Builds the next step, or null when no sequence can make progress now. */
  schedule(): StepPlan | null {
    if (!this.#healthy) return null;
    const b: StepBuild = {
      stepId: this.#nextStepId,
      entries: [],
      record: { all: [], seqs: [], epochs: [] },
      members: new Set(),
      preempted: new Set(),
      budget: this.config.maxBatchTokens,
    };
    this.#build = b;
    try {
      this.#yieldSlotsToInteractive();
      const running = this.#byPriority(this.#running);
      // 1. One token for every decoding sequence.
      for (const seq of running) {
        if (b.budget === 0) break;
        if (!this.#wantsDecode(seq)) continue;
        const table = this.#makeRoom(seq, 1, true);
        if (table) this.#add(seq, 1, table);
      }
      // 2. The next prefill chunk of every admitted sequence still reading its prompt.
      for (const seq of running) {
        if (b.budget === 0) break;
        if (!this.#wantsPrefill(seq)) continue;
        const n = Math.min(seq.unfed, b.budget);
        const table = this.#makeRoom(seq, n, false);
        if (table) this.#add(seq, n, table);
      }
      // 3. Admissions from the queue.
      this.#admit();
    } finally {
      this.#build = undefined;
    }
    if (b.entries.length === 0) return null;
    this.#nextStepId++;
    this.#inFlight.set(b.stepId, b.record);
    this.#lastBatchSize = b.entries.length;
    this.#lastBatchTokens = this.config.maxBatchTokens - b.budget;
    return { stepId: b.stepId, seqs: b.entries };
  }

  /**
   * Applies a step's sampled tokens: appends them, streams them, and ends sequences that hit a
   * stop condition. Results must come in step order; those of steps lost to an executor
   * failure, and tokens of sequences preempted or finished since, are ignored.
   */
  onResult(result: StepResult): void {
    const rec = this.#inFlight.get(result.stepId);
    if (!rec) return;
    const oldest = this.#inFlight.keys().next().value;
    if (oldest !== result.stepId) {
      throw new Error(`Scheduler: result of step ${result.stepId} arrived before step ${oldest}'s`);
    }
    this.#inFlight.delete(result.stepId);
    // The step ran: none of its sequences crashes the engine.
    for (const seq of rec.all) seq.faults = 0;
    if (result.sampled.length !== rec.seqs.length) {
      throw new Error(
        `Scheduler: step ${result.stepId} returned ${result.sampled.length} sampled tokens, its plan asked for ${rec.seqs.length}`,
      );
    }
    for (let i = 0; i < rec.seqs.length; i++) {
      const seq = rec.seqs[i]!, epoch = rec.epochs[i]!;
      const s = result.sampled[i]!;
      if (s.seqId !== seq.seqId) {
        throw new Error(
          `Scheduler: step ${result.stepId} entry ${i} is for seq ${s.seqId}, the plan had seq ${seq.seqId}`,
        );
      }
      if (seq.status !== "running" || seq.epoch !== epoch) continue;
      seq.pending--;
      seq.pushToken(s.token);
      if (seq.stopTokenIds.has(s.token)) {
        this.#finish(seq, "stop", s.token);
        continue;
      }
      if (seq.constraint) {
        if (!seq.constraint.accept(s.token)) {
          this.#retire(seq, {
            type: "failed",
            seqId: seq.seqId,
            code: "internal",
            message:
              `Generation failed: the engine sampled token ${s.token}, which the grammar does not allow there`,
          });
          continue;
        }
        seq.mask = undefined;
        this.#needMask.push(seq);
      }
      this.#reply(seq, {
        type: "token",
        seqId: seq.seqId,
        token: s.token,
        logprob: s.logprob,
        ...(s.top !== undefined ? { top: s.top } : {}),
        stepId: result.stepId,
      });
      if (seq.tokens.length >= seq.maxTotal) this.#finish(seq, "length");
    }
  }

  /**
   * The engine and its KV cache are gone: forget in-flight steps and cached blocks, and send
   * every running sequence back to the queue to be recomputed from its known tokens. Sequences
   * of the step that failed are suspects (or only its isolated suspect, if it had one); one
   * that reaches maxSeqFaults is failed instead, so a request that crashes the engine every
   * time cannot keep it restarting, while the requests that shared its steps go on.
   */
  onExecutorFailure(failedStepId?: number, error = "unknown error"): void {
    const failed = failedStepId === undefined ? undefined : this.#inFlight.get(failedStepId);
    const blamed = failed?.isolated ? [failed.isolated] : failed?.all ?? [];
    for (const seq of blamed) {
      if (seq.status !== "running" || ++seq.faults < this.config.maxSeqFaults) continue;
      this.#retire(seq, {
        type: "failed",
        seqId: seq.seqId,
        code: "internal",
        message:
          `Generation failed: the engine crashed in ${seq.faults} steps that included this request (last error: ${error})`,
      });
    }
    this.#inFlight.clear();
    for (const seq of this.#running) this.#requeue(seq);
    this.#running = [];
    this.kv.reset();
    this.#released = []; // the new engine never saw them
    this.#restarts++;
  }

  /** Nothing can run any more: fail every live sequence and refuse new ones. */
  failAll(code: GenerationErrorCode, message: string): void {
    this.#healthy = false;
    this.#inFlight.clear();
    for (const seq of [...this.#seqs.values()]) {
      this.#retire(seq, { type: "failed", seqId: seq.seqId, code, message });
    }
    this.kv.reset();
    this.#released = [];
  }

  stats(): SchedulerStats {
    const kv = this.kv.stats();
    return {
      running: this.#running.length,
      waiting: this.#waiting.length,
      kvBlocksUsed: kv.usedBlocks,
      kvBlocksFree: kv.freeBlocks,
      kvBlocksTotal: kv.numBlocks,
      kvBlockSize: kv.blockSize,
      prefixHitTokens: kv.prefixHitTokens,
      prefixQueryTokens: kv.prefixQueryTokens,
      prefixHitRate: kv.prefixHitRate,
      evictions: kv.evictions,
      preemptions: this.#preemptions,
      steps: this.#nextStepId,
      stepsInFlight: this.#inFlight.size,
      lastBatchSize: this.#lastBatchSize,
      lastBatchTokens: this.#lastBatchTokens,
      finished: this.#finished,
      executorRestarts: this.#restarts,
      executorHealthy: this.#healthy,
      draining: this.#draining,
    };
  }

  /** A lone sequence must always fit the pool, or preemption could never make room for it. */
  get #promptLimit(): number {
    return Math.min(this.config.contextLength, this.config.numBlocks * this.config.blockSize);
  }

  /** Why a submission is refused, if it is. */
  #refusal(spec: SeqSpec): { code: GenerationErrorCode; message: string } | undefined {
    const { seqId, prompt } = spec;
    if (this.#seqs.has(seqId)) {
      return {
        code: "internal",
        message: `Cannot submit sequence ${seqId}: the id is already live`,
      };
    }
    if (!this.#healthy) return { code: "internal", message: "Cannot submit: the executor is down" };
    if (this.#draining) {
      return { code: "draining", message: "Cannot submit: the server is draining" };
    }
    // Those that can start at the next step are not queued for the purpose of overload.
    const freeSlots = Math.max(0, this.config.maxRunning - this.#running.length);
    const queued = this.#waiting.length - freeSlots;
    if (queued >= this.config.maxWaiting) {
      return {
        code: "overloaded",
        message:
          `Cannot submit: ${queued} requests are waiting beyond the ${freeSlots} free running slots, the limit is ${this.config.maxWaiting}`,
      };
    }
    if (prompt.length === 0) {
      return {
        code: "internal",
        message: `Cannot submit sequence ${seqId}: the prompt has no tokens`,
      };
    }
    const vocab = this.config.vocabSize;
    const bad = vocab > 0 ? prompt.findIndex((t) => !isTokenId(t, vocab)) : -1;
    if (bad >= 0) {
      return {
        code: "internal",
        message: `Cannot submit: prompt token ${bad} is ${
          prompt[bad]
        }, outside the vocabulary of ${vocab} ids`,
      };
    }
    const controls = spec.controls === undefined
      ? undefined
      : logitControlsProblem(spec.controls, vocab);
    if (controls !== undefined) {
      return { code: "internal", message: `Cannot submit sequence ${seqId}: ${controls}` };
    }
    const limit = this.#promptLimit;
    if (prompt.length >= limit) {
      return {
        code: "context_length_exceeded",
        message:
          `Cannot submit: the prompt has ${prompt.length} tokens; the context holds ${limit}, and at least one must remain for the completion`,
      };
    }
    return undefined;
  }

  /** A repeat suspect shares a step with no other suspect, so a crash there names the culprit. */
  #barred(seq: Sequence): boolean {
    return seq.faults >= ISOLATE_AFTER_FAULTS && this.#build!.record.isolated !== undefined;
  }

  /**
   * Running, with one token to feed (known, or sampled in flight), and room to sample one more.
   * A constrained sequence's next mask depends on the token it sampled last, so it decodes only
   * once that token is here and its grammar has seen it, or, with late masks, feeds its token in
   * flight and gets the mask that follows it while the step runs (one such mask at a time).
   */
  #wantsDecode(seq: Sequence): boolean {
    const ready = seq.constraint
      ? seq.pending === 0
        ? seq.unfed === 1 && seq.mask !== undefined
        : this.config.lateMasks && !seq.needsKnownTokens && seq.late === undefined
      : seq.needsKnownTokens
      ? seq.pending === 0 && seq.unfed === 1
      : seq.pending > 0 || seq.unfed === 1;
    return seq.status === "running" && !seq.held && ready && seq.canSample && !this.#barred(seq);
  }

  /** Running, not yet in this step, with known tokens to feed (a prompt or a recomputation). */
  #wantsPrefill(seq: Sequence): boolean {
    return seq.status === "running" && !seq.held && !this.#build!.members.has(seq) &&
      seq.pending === 0 && seq.unfed >= 2 && this.#maskReady(seq) && !this.#barred(seq);
  }

  /** An unconstrained sequence, or a constrained one whose next mask is known. */
  #maskReady(seq: Sequence): boolean {
    return !seq.constraint || seq.mask !== undefined;
  }

  /** Adds n of the sequence's tokens (or its last sampled one) to the step being built. */
  #add(seq: Sequence, n: number, table: readonly number[]): void {
    const b = this.#build!;
    if (seq.faults >= ISOLATE_AFTER_FAULTS) b.record.isolated = seq;
    const start = seq.numScheduled;
    const useLastSampled = seq.pending > 0;
    const sample = useLastSampled || start + n === seq.tokens.length;
    const adjust = sample ? seq.penalties?.adjust(start + n) : undefined;
    // A constrained decode of its token in flight: its mask is the one after that token.
    let late: Promise<Uint32Array> | undefined;
    if (sample && seq.constraint && useLastSampled) {
      let resolve!: (m: Uint32Array) => void;
      late = new Promise<Uint32Array>((r) => resolve = r);
      seq.late = { promise: late, resolve };
    }
    b.entries.push({
      seqId: seq.seqId,
      tokens: useLastSampled ? NO_TOKENS : seq.tokens.slice(start, start + n),
      useLastSampled,
      startPos: start,
      // The allocator's own array, not a copy: a table only grows at its end while its
      // sequence lives, so it still covers this step when the engine reads it later.
      blockTable: table,
      sample,
      sampling: seq.sampling,
      ...(adjust !== undefined ? { adjust } : {}),
      ...(sample && seq.topLogprobs > 0 ? { topLogprobs: seq.topLogprobs } : {}),
      ...(late ? { lateTokenMask: late } : sample && seq.mask ? { tokenMask: seq.mask } : {}),
    });
    seq.numScheduled += n;
    b.members.add(seq);
    b.record.all.push(seq);
    if (sample) {
      seq.pending++;
      b.record.seqs.push(seq);
      b.record.epochs.push(seq.epoch);
    }
    b.budget -= n;
  }

  /**
   * Admits waiting sequences, highest priority first, while the budget and the running cap
   * allow; each may preempt strictly lower-ranked running work to fit. First come, first
   * served: a later arrival does not jump a request that does not fit.
   */
  #admit(): void {
    const b = this.#build!;
    let admitted = false;
    for (const seq of this.#byPriority(this.#waiting)) {
      if (b.budget === 0 || this.#running.length >= this.config.maxRunning) break;
      // No room for it now, nor for those behind it.
      if (b.preempted.has(seq) && b.entries.length > 0) break;
      if (seq.held || this.#barred(seq) || !this.#maskReady(seq)) continue;
      let cached = 0, n = 0, table: readonly number[] | null = null;
      for (;;) {
        // Again after each preemption: the victim's free may have cached more of this prompt,
        // and allocateSlots takes every cached block it finds, so the plan must start after them.
        cached = this.kv.computedPrefix(seq);
        n = Math.min(seq.tokens.length - cached, b.budget);
        const reserve = this.#running.length > 0 ? this.config.watermarkBlocks : 0;
        table = this.kv.allocateSlots(seq, n, reserve);
        if (table) break;
        const victim = this.#victim(seq, true);
        if (!victim) break;
        this.#preempt(victim);
      }
      if (!table) break;
      seq.status = "running";
      seq.admitOrder = this.#admissions++;
      seq.numScheduled = cached;
      this.#running.push(seq);
      admitted = true;
      if (seq.cachedTokens < 0) {
        seq.cachedTokens = cached;
        this.#reply(seq, { type: "scheduled", seqId: seq.seqId, cachedTokens: cached });
      }
      this.#add(seq, n, table);
    }
    if (admitted) this.#waiting = this.#waiting.filter((s) => s.status === "waiting");
  }

  /** Batch work ranks like interactive work once it has waited agingSteps. */
  #rank(seq: Sequence): number {
    return seq.priority === "interactive" ||
        this.#nextStepId - seq.arrivalStep >= this.config.agingSteps
      ? 0
      : 1;
  }

  /** Rank 0 first, then rank 1, each keeping the list's order. */
  #byPriority(list: readonly Sequence[]): Sequence[] {
    const high: Sequence[] = [], low: Sequence[] = [];
    for (const s of list) (this.#rank(s) === 0 ? high : low).push(s);
    return high.length === 0 ? low : low.length === 0 ? high : high.concat(low);
  }

  /**
   * Allocates slots for a running sequence, preempting lower-priority or later-admitted ones
   * not in this step. A decode that still finds no room preempts itself; a prefill chunk waits.
   */
  #makeRoom(seq: Sequence, n: number, isDecode: boolean): readonly number[] | null {
    for (;;) {
      const table = this.kv.allocateSlots(seq, n);
      if (table) return table;
      const victim = this.#victim(seq, false);
      if (victim) {
        this.#preempt(victim);
        continue;
      }
      if (isDecode) this.#preempt(seq);
      return null;
    }
  }

  /**
   * Interactive work waiting for a running slot takes one from batch work, most recently
   * admitted first: the cap on running sequences must not let a batch load keep interactive
   * requests queued. The batch sequence is recomputed later (its full blocks stay in the prefix
   * cache), and aging lifts it to interactive rank, so it is not starved.
   */
  #yieldSlotsToInteractive(): void {
    const wanting = this.#waiting.filter((s) => this.#rank(s) === 0).length;
    let short = wanting - (this.config.maxRunning - this.#running.length);
    for (; short > 0; short--) {
      const victim = this.#running.findLast((s) => this.#rank(s) === 1);
      if (!victim) return;
      this.#preempt(victim);
    }
  }

  /**
   * The running sequence to preempt for `seq`: lowest rank, then most recently admitted, not
   * part of the step being built. For an admission (`strictlyLower`) only lower ranks qualify;
   * otherwise also equal ranks admitted after `seq`.
   */
  #victim(seq: Sequence, strictlyLower: boolean): Sequence | undefined {
    const members = this.#build!.members;
    const rank = this.#rank(seq);
    for (let r = 1; r >= rank; r--) {
      if (strictlyLower && r === rank) break;
      for (let i = this.#running.length - 1; i >= 0; i--) {
        const s = this.#running[i]!;
        if (s === seq || members.has(s) || this.#rank(s) !== r) continue;
        if (r === rank && s.admitOrder < seq.admitOrder) break;
        return s;
      }
    }
    return undefined;
  }

  /** Frees a running sequence's blocks and puts it back in the queue, ahead of later arrivals. */
  #preempt(seq: Sequence): void {
    this.kv.free(seq);
    this.#build!.preempted.add(seq);
    this.#running.splice(this.#running.indexOf(seq), 1);
    this.#requeue(seq);
    this.#preemptions++;
    this.#released.push(seq.seqId);
  }

  #requeue(seq: Sequence): void {
    this.#settleLate(seq);
    seq.status = "waiting";
    seq.numScheduled = 0;
    seq.pending = 0;
    seq.epoch++;
    let i = this.#waiting.length;
    while (i > 0 && this.#waiting[i - 1]!.arrivalOrder > seq.arrivalOrder) i--;
    this.#waiting.splice(i, 0, seq);
  }

  /** Ends a live sequence with a finish reason (the stop token that ended it, if one did). */
  #finish(seq: Sequence, reason: FinishReason, stopToken?: number): void {
    const completionTokens = seq.numGenerated;
    this.#retire(
      seq,
      stopToken === undefined
        ? { type: "finished", seqId: seq.seqId, reason, completionTokens }
        : { type: "finished", seqId: seq.seqId, reason, completionTokens, stopToken },
    );
  }

  /**
   * The one way a live sequence ends, however it ends: it leaves its queue and its blocks,
   * its in-flight results go stale, the engine may forget it, and its owner hears `event`.
   */
  #retire(seq: Sequence, event: SeqEvent): void {
    const queue = seq.status === "running" ? this.#running : this.#waiting;
    const i = queue.indexOf(seq);
    if (i >= 0) queue.splice(i, 1);
    this.kv.free(seq);
    if (seq.cachedTokens >= 0) this.#released.push(seq.seqId); // it reached the engine
    this.#settleLate(seq);
    seq.status = "finished";
    seq.epoch++;
    this.#finished++;
    this.#seqs.delete(seq.seqId);
    seq.constraint?.dispose();
    this.#reply(seq, event);
    seq.reply = undefined;
  }

  /**
   * Its step in flight is stale (the sequence ended or goes back to the queue): the engine still
   * waits for that step's mask, so it gets one allowing every id (the token is dropped).
   */
  #settleLate(seq: Sequence): void {
    if (!seq.late) return;
    const words = seq.mask?.length ?? Math.ceil((this.config.vocabSize || 32) / 32);
    seq.late.resolve(new Uint32Array(words).fill(0xffffffff));
    seq.late = undefined;
  }

  #reply(seq: Sequence, event: SeqEvent): void {
    if (seq.reply) safeReply(seq.reply, event);
  }
}

/** Read through a call: TypeScript narrows a field as if no await could change it. */
function ended(seq: Sequence): boolean {
  return seq.status === "finished";
}

/** A listener that throws must not corrupt the scheduler's state. */
function safeReply(reply: SeqEventSink, event: SeqEvent): void {
  try {
    reply(event);
  } catch (e) {
    console.error(
      `Scheduler: the reply handler of seq ${event.seqId} threw on "${event.type}":`,
      e,
    );
  }
}
