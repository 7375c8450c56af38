import { BlockAllocator } from "./block_allocator.ts";
import { DEFAULT_LIMITS } from "../engine/limits.ts";
import type { SeqInput, StepPlan, StepResult } from "../engine/engine.ts";
import type { FinishReason, GenerationErrorCode } from "./generation.ts";
import { Sequence } from "./sequence.ts";
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
  /** Most sequences waiting; more submissions are refused as "overloaded". */
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
  /** Token ids must be below this (0: unchecked); an out-of-range id would crash the engine. */
  readonly vocabSize: number;
  readonly prefixCaching: boolean;
}

const SCHEDULER_DEFAULTS = {
  maxBatchTokens: DEFAULT_LIMITS.maxBatchTokens,
  maxRunning: DEFAULT_LIMITS.maxRunning,
  maxWaiting: DEFAULT_LIMITS.maxWaiting,
  agingSteps: DEFAULT_LIMITS.agingSteps,
  prefixCaching: true,
  maxSeqFaults: DEFAULT_LIMITS.maxSeqFaults,
  vocabSize: 0,
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

const NO_TOKENS: readonly number[] = Object.freeze([]);

/** Crashed steps after which a sequence runs as the only suspect of its step, to settle blame. */
const ISOLATE_AFTER_FAULTS = 2;

/**
 * The continuous-batching policy as a synchronous state machine (the SchedulerActor drives it).
 * Each schedule() builds one step under the token budget and the sequence cap: single-token
 * decodes first, then prefill chunks, highest priority first. KV blocks are allocated lazily per
 * step; when they run out the lowest-priority, most recently admitted sequence is preempted and
 * later recomputed. schedule() may be called again before earlier results come back
 * (pipelining): a decode then feeds "the token sampled last", and tokens sampled past a stop
 * are dropped when they arrive.
 */
export class Scheduler {
  readonly config: SchedulerConfig;
  readonly kv: BlockAllocator;
  /** Live sequences (waiting or running). */
  #seqs = new Map<number, Sequence>();
  #replies = new Map<number, SeqEventSink>();
  /** Sorted by arrivalOrder. */
  #waiting: Sequence[] = [];
  /** In admission order. */
  #running: Sequence[] = [];
  #inFlight = new Map<number, InFlightStep>();
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
    const reject = (code: GenerationErrorCode, message: string) =>
      safeReply(reply, { type: "rejected", seqId, code, message });
    if (this.#seqs.has(seqId)) {
      return reject("internal", `Cannot submit sequence ${seqId}: the id is already live`);
    }
    if (!this.#healthy) return reject("internal", "Cannot submit: the executor is down");
    if (this.#draining) return reject("draining", "Cannot submit: the server is draining");
    if (this.#waiting.length >= this.config.maxWaiting) {
      return reject(
        "overloaded",
        `Cannot submit: ${this.#waiting.length} requests are waiting, the limit is ${this.config.maxWaiting}`,
      );
    }
    if (prompt.length === 0) {
      return reject("internal", `Cannot submit sequence ${seqId}: the prompt has no tokens`);
    }
    const vocab = this.config.vocabSize;
    if (vocab > 0) {
      const bad = prompt.findIndex((t) => !(Number.isInteger(t) && t >= 0 && t < vocab));
      if (bad >= 0) {
        return reject(
          "internal",
          `Cannot submit: prompt token ${bad} is ${
            prompt[bad]
          }, outside the vocabulary of ${vocab} ids`,
        );
      }
    }
    // A lone sequence must always fit the pool, or preemption could never make room for it.
    const limit = Math.min(
      this.config.contextLength,
      this.config.numBlocks * this.config.blockSize,
    );
    if (prompt.length >= limit) {
      return reject(
        "context_length_exceeded",
        `Cannot submit: the prompt has ${prompt.length} tokens; the context holds ${limit}, and at least one must remain for the completion`,
      );
    }
    safeReply(reply, { type: "accepted", seqId, promptTokens: prompt.length });
    if (spec.maxTokens <= 0) {
      safeReply(reply, { type: "finished", seqId, reason: "length", completionTokens: 0 });
      this.#finished++;
      return;
    }
    const seq = new Sequence({
      seqId,
      prompt,
      maxTotal: prompt.length + Math.min(spec.maxTokens, limit - prompt.length),
      sampling: spec.sampling,
      stopTokenIds: spec.stopTokenIds,
      priority: spec.priority,
      arrivalStep: this.#nextStepId,
      arrivalOrder: this.#arrivals++,
    });
    this.#seqs.set(seqId, seq);
    this.#replies.set(seqId, reply);
    this.#waiting.push(seq);
  }

  /**
   * Ends a live sequence at once and frees its blocks; results still in flight for it are
   * dropped. Answers finished("cancelled") when `notify`. Unknown ids are ignored (it may have
   * finished meanwhile).
   */
  cancel(seqId: number, notify = true): void {
    const seq = this.#seqs.get(seqId);
    if (!seq) return;
    if (!notify) this.#replies.delete(seqId);
    if (seq.status === "waiting") {
      this.#waiting.splice(this.#waiting.indexOf(seq), 1);
      this.#end(seq, "cancelled");
    } else {
      this.#finish(seq, "cancelled");
    }
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
  schedule(retried = false): StepPlan | null {
    if (!this.#healthy) return null;
    const stepId = this.#nextStepId;
    const entries: SeqInput[] = [];
    const sampled: InFlightStep = { all: [], seqs: [], epochs: [] };
    let budget = this.config.maxBatchTokens;

    // A repeat suspect shares a step with no other suspect, so a crash there names the culprit.
    const barred = (seq: Sequence) =>
      seq.faults >= ISOLATE_AFTER_FAULTS && sampled.isolated !== undefined;
    const push = (seq: Sequence, n: number, table: readonly number[]) => {
      if (seq.faults >= ISOLATE_AFTER_FAULTS) sampled.isolated = seq;
      const start = seq.numScheduled;
      const useLastSampled = seq.pending > 0;
      const sample = useLastSampled || start + n === seq.tokens.length;
      entries.push({
        seqId: seq.seqId,
        tokens: useLastSampled ? NO_TOKENS : seq.tokens.slice(start, start + n),
        useLastSampled,
        startPos: start,
        // The allocator's own array, not a copy: a table only grows at its end while its
        // sequence lives, so it still covers this step when the engine reads it later.
        blockTable: table,
        sample,
        sampling: seq.sampling,
      });
      seq.numScheduled += n;
      seq.lastStep = stepId;
      sampled.all.push(seq);
      if (sample) {
        seq.pending++;
        sampled.seqs.push(seq);
        sampled.epochs.push(seq.epoch);
      }
      budget -= n;
    };

    this.#yieldSlotsToInteractive();

    // 1. One token for every decoding sequence, highest priority first.
    const running = this.#byPriority(this.#running);
    for (const seq of running) {
      if (budget === 0) break;
      if (seq.status !== "running" || !(seq.pending > 0 || seq.unfed === 1) || barred(seq)) {
        continue;
      }
      // With tokens in flight it may already have reached its length limit.
      if (!seq.canSample) continue;
      const table = this.#makeRoom(seq, 1, stepId, true);
      if (table) push(seq, 1, table);
    }

    // 2. Prefill chunks of admitted sequences, then admissions from the waiting queue.
    for (const seq of running) {
      if (budget === 0) break;
      if (
        seq.status !== "running" || seq.lastStep === stepId || seq.pending > 0 || seq.unfed < 2 ||
        barred(seq)
      ) {
        continue;
      }
      const n = Math.min(seq.unfed, budget);
      const table = this.#makeRoom(seq, n, stepId, false);
      if (table) push(seq, n, table);
    }
    let admitted = false;
    for (const seq of this.#byPriority(this.#waiting)) {
      if (budget === 0 || this.#running.length >= this.config.maxRunning) break;
      // Preempted while building this step: there is no room for it now, nor for those behind it.
      if (seq.lastStep === stepId) break;
      if (barred(seq)) continue;
      let cached = 0, n = 0, table: readonly number[] | null = null;
      for (;;) {
        // Again after each preemption: the victim's free may have cached more of this prompt,
        // and allocateSlots takes every cached block it finds, so the plan must start after them.
        cached = this.kv.computedPrefix(seq);
        n = Math.min(seq.tokens.length - cached, budget);
        const reserve = this.#running.length > 0 ? this.config.watermarkBlocks : 0;
        table = this.kv.allocateSlots(seq, n, reserve);
        if (table) break;
        const victim = this.#victim(seq, stepId, true);
        if (!victim) break;
        this.#preempt(victim);
      }
      // First come, first served: a later arrival does not jump a request that does not fit.
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
      push(seq, n, table);
    }
    if (admitted) this.#waiting = this.#waiting.filter((s) => s.status === "waiting");

    if (entries.length === 0) {
      // Sequences preempted while building this step are marked to wait for the next one, but
      // no step is emitted and nothing in flight may come back to call schedule() again: clear
      // the marks and try once more rather than stall with work waiting.
      let marked = false;
      for (const w of this.#waiting) {
        if (w.lastStep === stepId) {
          w.lastStep = -1;
          marked = true;
        }
      }
      return marked && !retried ? this.schedule(true) : null;
    }
    this.#nextStepId++;
    this.#inFlight.set(stepId, sampled);
    this.#lastBatchSize = entries.length;
    this.#lastBatchTokens = this.config.maxBatchTokens - budget;
    return { stepId, seqs: entries };
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
      seq.tokens.push(s.token);
      if (seq.stopTokenIds.has(s.token)) {
        this.#finish(seq, "stop", s.token);
        continue;
      }
      this.#reply(seq, {
        type: "token",
        seqId: seq.seqId,
        token: s.token,
        logprob: s.logprob,
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
      this.#running.splice(this.#running.indexOf(seq), 1);
      this.#reply(seq, {
        type: "failed",
        seqId: seq.seqId,
        code: "internal",
        message:
          `Generation failed: the engine crashed in ${seq.faults} steps that included this request (last error: ${error})`,
      });
      seq.status = "finished";
      seq.epoch++;
      this.#finished++;
      this.#seqs.delete(seq.seqId);
      this.#replies.delete(seq.seqId);
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
      this.#reply(seq, { type: "failed", seqId: seq.seqId, code, message });
      seq.status = "finished";
      seq.epoch++;
    }
    this.#seqs.clear();
    this.#replies.clear();
    this.#waiting = [];
    this.#running = [];
    this.kv.reset();
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
  #makeRoom(seq: Sequence, n: number, stepId: number, isDecode: boolean): readonly number[] | null {
    for (;;) {
      const table = this.kv.allocateSlots(seq, n);
      if (table) return table;
      const victim = this.#victim(seq, stepId, false);
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
  #victim(seq: Sequence, stepId: number, strictlyLower: boolean): Sequence | undefined {
    const rank = this.#rank(seq);
    for (let r = 1; r >= rank; r--) {
      if (strictlyLower && r === rank) break;
      for (let i = this.#running.length - 1; i >= 0; i--) {
        const s = this.#running[i]!;
        if (s === seq || s.lastStep === stepId || this.#rank(s) !== r) continue;
        if (r === rank && s.admitOrder < seq.admitOrder) break;
        return s;
      }
    }
    return undefined;
  }

  /** Frees a running sequence's blocks and puts it back in the queue, ahead of later arrivals. */
  #preempt(seq: Sequence): void {
    this.kv.free(seq);
    seq.lastStep = this.#nextStepId;
    this.#running.splice(this.#running.indexOf(seq), 1);
    this.#requeue(seq);
    this.#preemptions++;
    this.#released.push(seq.seqId);
  }

  #requeue(seq: Sequence): void {
    seq.status = "waiting";
    seq.numScheduled = 0;
    seq.pending = 0;
    seq.epoch++;
    let i = this.#waiting.length;
    while (i > 0 && this.#waiting[i - 1]!.arrivalOrder > seq.arrivalOrder) i--;
    this.#waiting.splice(i, 0, seq);
  }

  #finish(seq: Sequence, reason: FinishReason, stopToken?: number): void {
    this.kv.free(seq);
    const i = this.#running.indexOf(seq);
    if (i >= 0) this.#running.splice(i, 1);
    this.#end(seq, reason, stopToken);
  }

  #end(seq: Sequence, reason: FinishReason, stopToken?: number): void {
    if (seq.cachedTokens >= 0) this.#released.push(seq.seqId); // it reached the engine
    seq.status = "finished";
    seq.epoch++;
    this.#finished++;
    const event: SeqEvent = stopToken === undefined
      ? { type: "finished", seqId: seq.seqId, reason, completionTokens: seq.numGenerated }
      : {
        type: "finished",
        seqId: seq.seqId,
        reason,
        completionTokens: seq.numGenerated,
        stopToken,
      };
    this.#reply(seq, event);
    this.#seqs.delete(seq.seqId);
    this.#replies.delete(seq.seqId);
  }

  #reply(seq: Sequence, event: SeqEvent): void {
    const reply = this.#replies.get(seq.seqId);
    if (reply) safeReply(reply, event);
  }
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
