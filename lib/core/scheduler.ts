import { BlockAllocator } from "./block_allocator.ts";
import type { StepPlan, StepResult } from "../engine/engine.ts";
import type { FinishReason, GenerationErrorCode } from "./generation.ts";
import { Sequence } from "./sequence.ts";
import type { SchedulerStats, SeqEvent, SeqEventSink, SeqSpec } from "./seq_events.ts";
import type { SchedulerConfig } from "./scheduler_config.ts";
import { promptLimit, submissionRefusal } from "./admission.ts";
import { byPriority, foreground, type Rank, rank, rankOneLive } from "./priority.ts";
import { pickVictim, slotVictims } from "./preemption.ts";
import { type InFlightStep, InFlightSteps, maskReady, StepBuild } from "./step_build.ts";
import { MaskQueue } from "./mask_refresh.ts";
import { SeqQueues } from "./seq_queues.ts";
import { type PromptBacklog, StepCost } from "./step_cost.ts";

export { type SchedulerConfig, schedulerConfig } from "./scheduler_config.ts";

/**
 * The continuous-batching policy as a synchronous state machine (the SchedulerActor drives it).
 * Each schedule() builds one step under the token budget and the sequence cap: single-token
 * decodes first, then prefill chunks, then admissions, highest priority first; batch rows
 * yield the step while interactive work is starting (lib/core/priority.ts). A burst of
 * interactive prompts is cut into steps between prompts at the size StepCost finds gives the
 * least mean time to first token, so each prompt's first token comes with its own prefill and
 * running decodes get a token every step meanwhile (lib/core/step_cost.ts). KV blocks are
 * allocated lazily per step; when they run out the lowest-priority, most recently admitted
 * sequence is preempted and later recomputed. schedule() may be called again before earlier
 * results come back (pipelining): a decode then feeds "the token sampled last", and tokens
 * sampled past a stop are dropped when they arrive. Plans are checked by the engines
 * (lib/engine/step_validation.ts) and requests by the edge; submit() checks only what would
 * let one request fail a step shared with others (lib/core/admission.ts). Every event for a
 * sequence goes to the one `emit` sink; routing it to the sequence's owner is the actor's job.
 */
export class Scheduler {
  readonly config: SchedulerConfig;
  readonly #kv: BlockAllocator;
  readonly #emit: SeqEventSink;
  readonly #q: SeqQueues;
  readonly #inFlight = new InFlightSteps();
  /** Set only while schedule() runs. */
  #build: StepBuild | undefined;
  #nextStepId = 0;
  #arrivals = 0;
  /** What stats() reports as counted. */
  readonly #counts = {
    preemptions: 0,
    finished: 0,
    executorRestarts: 0,
    lastBatchSize: 0,
    lastBatchTokens: 0,
  };
  #healthy = true;
  #draining = false;
  /** Ids whose per-sequence engine state can go (ended or preempted), not yet handed over. */
  #released: number[] = [];
  readonly #masks = new MaskQueue();
  readonly #cost = new StepCost();
  readonly #rankOf = (seq: Sequence): Rank => rank(seq, this.#nextStepId, this.config.agingSteps);

  /** `emit` hears every sequence's events, synchronously; it must not throw. */
  constructor(config: SchedulerConfig, emit: SeqEventSink = () => {}) {
    this.config = config;
    this.#emit = emit;
    this.#q = new SeqQueues(Math.ceil((config.vocabSize || 32) / 32));
    this.#kv = new BlockAllocator({
      numBlocks: config.numBlocks,
      blockSize: config.blockSize,
      prefixCaching: config.prefixCaching,
    });
  }

  /** Sequences not yet finished (waiting or running). */
  get numLive(): number {
    return this.#q.live.size;
  }

  get stepsInFlight(): number {
    return this.#inFlight.size;
  }

  /** Whether constrained sequences wait for their next mask (call refreshMasks before schedule). */
  get masksPending(): boolean {
    return this.#masks.pending;
  }

  /** The prefix cache's block hashes, newest last (see BlockAllocator.cachedBlockHashes). */
  cachedBlockHashes(limit: number): number[] {
    return this.#kv.cachedBlockHashes(limit);
  }

  /** Throws if the KV books disagree, or hold blocks for a sequence not running. For tests. */
  checkConsistency(): void {
    this.#kv.checkConsistency();
    if (this.#kv.numSeqs > this.#q.running.length) {
      throw new Error(
        `Scheduler: the allocator holds blocks for ${this.#kv.numSeqs} sequences, ${this.#q.running.length} are running`,
      );
    }
  }

  /** Stop accepting submissions (graceful shutdown); live sequences go on. */
  drain(): void {
    this.#draining = true;
  }

  /** Queues a sequence; emits accepted or rejected (prompt too long, queue full, draining). */
  submit(spec: SeqSpec): void {
    const { seqId, prompt } = spec;
    const problem = submissionRefusal(spec, this.config, {
      live: (id) => this.#q.live.has(id),
      healthy: this.#healthy,
      draining: this.#draining,
      running: this.#q.running.length,
      waiting: this.#q.waiting.length,
    });
    if (problem) {
      spec.constraint?.dispose();
      this.#emit({ type: "rejected", seqId, ...problem });
      return;
    }
    this.#emit({ type: "accepted", seqId, promptTokens: prompt.length });
    if (spec.maxTokens <= 0 && !spec.embed) {
      spec.constraint?.dispose();
      this.#emit({ type: "finished", seqId, reason: "length", completionTokens: 0 });
      this.#counts.finished++;
      return;
    }
    const room = promptLimit(this.config) - prompt.length;
    const maxTotal = prompt.length + (spec.embed ? 0 : Math.min(spec.maxTokens, room));
    const seq = Sequence.fromSpec(spec, maxTotal, this.#nextStepId, this.#arrivals++);
    this.#q.add(seq);
    if (seq.constraint) this.#masks.push(seq);
  }

  /**
   * Computes the next token mask of every constrained sequence whose grammar has seen a new
   * token (lib/core/mask_refresh.ts). The only asynchronous step of the scheduler; the owning
   * actor awaits it between messages, so nothing else touches the scheduler meanwhile.
   */
  refreshMasks(): Promise<void> {
    return this.#masks.refresh(this.config.vocabSize, (seq, outcome) => {
      if ("stop" in outcome) this.#finish(seq, "stop");
      else this.#fail(seq, outcome.error);
    });
  }

  /**
   * Ends a live sequence at once and frees its blocks; results still in flight for it are
   * dropped. Emits finished("cancelled"). Unknown ids are ignored (it may have finished).
   */
  cancel(seqId: number): void {
    const seq = this.#q.live.get(seqId);
    if (seq) this.#finish(seq, "cancelled");
  }

  /**
   * Holds (or resumes) a live sequence whose client has stopped reading: a held sequence keeps
   * its place and its KV blocks, but no step decodes, prefills or admits it. Unknown ids are
   * ignored (it may have finished meanwhile).
   */
  hold(seqId: number, held: boolean): void {
    const seq = this.#q.live.get(seqId);
    if (seq) seq.held = held;
  }

  /**
   * Ids of sequences that ended or were preempted since the last call: the engine may drop
   * their per-sequence state (engine.release) before running the next plan.
   */
  takeReleased(): number[] {
    return this.#released.splice(0);
  }

  /** Whether only batch-rank work could use the next step (a "background" step). */
  get backgroundOnly(): boolean {
    return foreground(this.#q.live.values(), this.#rankOf) === "none";
  }

  /**
   * Builds the next step, or null when no sequence can make progress now. A background step
   * needs fewer than backgroundDepth steps in flight, and `background` (the actor's pacing);
   * so does a step of rank-0 decodes while rank-1 work is live (its rows ride in it). Only a
   * step for starting rank-0 work, which rank-1 rows yield, may go deeper.
   */
  schedule(background = true): StepPlan | null {
    if (!this.#healthy) return null;
    const fg = foreground(this.#q.live.values(), this.#rankOf);
    const depth = background ? this.config.backgroundDepth : 0;
    if (fg === "none" && this.#inFlight.size >= depth) return null;
    if (
      fg === "running" && this.config.shallowBesideBatch &&
      this.#inFlight.size >= this.config.backgroundDepth &&
      rankOneLive(this.#q.live.values(), this.#rankOf)
    ) return null;
    // While interactive work waits or reads its prompt, batch rows yield the whole step.
    const yieldLow = fg === "starting";
    const b = new StepBuild(this.#nextStepId, this.config.maxBatchTokens, this.config.lateMasks);
    this.#build = b;
    try {
      for (const v of slotVictims(this.#q, this.config.maxRunning, this.#rankOf)) this.#preempt(v);
      const running = byPriority(this.#q.running, this.#rankOf);
      const allowed = (seq: Sequence) => b.budget > 0 && !(yieldLow && this.#rankOf(seq) === 1);
      // 1. One token for every decoding sequence.
      for (const seq of running) {
        if (!allowed(seq)) break;
        if (!b.wantsDecode(seq)) continue;
        const table = this.#makeRoom(seq, 1, true);
        if (table) b.add(seq, 1, table);
      }
      // Only interactive prompts are cut: batch work wants throughput, not early first tokens.
      if (yieldLow) b.burstRows = this.#cost.burstRows(this.#prefillBacklog(), b.entries.length);
      // 2. The next prefill chunk of the admitted sequences still reading their prompts, while
      // the step has room for prompts (a burst is cut into steps between prompts).
      for (const seq of running) {
        if (!allowed(seq) || !b.roomForPrefill) break;
        if (!b.wantsPrefill(seq)) continue;
        const n = Math.min(seq.unfed, b.budget);
        const table = this.#makeRoom(seq, n, false);
        if (table) b.addPrefill(seq, n, table);
      }
      // 3. Admissions from the queue.
      this.#admit(allowed);
    } finally {
      this.#build = undefined;
    }
    // Only an admission, which always adds an entry, asks for a copy.
    const kvCopies = this.#kv.takeCopies();
    if (b.entries.length === 0) return null;
    this.#nextStepId++;
    this.#inFlight.add(b.stepId, b.record);
    this.#counts.lastBatchSize = b.entries.length;
    this.#counts.lastBatchTokens = b.maxTokens - b.budget;
    return { stepId: b.stepId, seqs: b.entries, ...(kvCopies.length > 0 ? { kvCopies } : {}) };
  }

  /**
   * Applies a step's sampled tokens: appends them, streams them, and ends sequences that hit a
   * stop condition. Results must come in step order; those of steps lost to an executor
   * failure, and tokens of sequences preempted or finished since, are ignored. `busyMs`, how
   * long the step alone kept the engine busy, teaches the scheduler what steps cost (StepCost),
   * by which it cuts bursts of prompts into steps; without it bursts are not cut.
   */
  onResult(result: StepResult, busyMs?: number): void {
    const rec = this.#inFlight.take(result);
    if (!rec) return;
    if (busyMs !== undefined) this.#cost.observe(rec.rows, rec.seqs.length, busyMs);
    // The step ran: none of its sequences crashes the engine.
    for (const seq of rec.all) seq.faults = 0;
    for (let i = 0; i < rec.seqs.length; i++) {
      const seq = rec.seqs[i]!, s = result.sampled[i]!;
      if (seq.status !== "running" || seq.epoch !== rec.epochs[i]) continue;
      seq.pending--;
      seq.pushToken(s.token);
      if (seq.stopTokenIds.has(s.token)) {
        this.#finish(seq, "stop", s.token);
        continue;
      }
      if (seq.constraint) {
        if (!seq.constraint.accept(s.token)) {
          this.#fail(
            seq,
            `Generation failed: the engine sampled token ${s.token}, which the grammar does not allow there`,
          );
          continue;
        }
        seq.mask = undefined;
        this.#masks.push(seq);
      }
      this.#emit({
        type: "token",
        seqId: seq.seqId,
        token: s.token,
        logprob: s.logprob,
        ...(s.top !== undefined ? { top: s.top } : {}),
        stepId: result.stepId,
      });
      if (seq.tokens.length >= seq.maxTotal) this.#finish(seq, "length");
    }
    this.#embeddings(result, rec);
  }

  /**
   * An embedding's hidden states go to its owner; the step that computed its last prompt
   * token ends it (its KV blocks are freed then and never cached).
   */
  #embeddings(result: StepResult, rec: InFlightStep): void {
    const hidden = result.hidden ?? [];
    for (let i = 0; i < rec.hidden.length; i++) {
      const seq = rec.hidden[i]!;
      if (seq.status !== "running" || seq.epoch !== rec.hiddenEpochs[i]) continue;
      this.#emit({ type: "hidden", seqId: seq.seqId, states: hidden[i]! });
    }
    for (let i = 0; i < rec.embedded.length; i++) {
      const seq = rec.embedded[i]!;
      if (seq.status !== "running" || seq.epoch !== rec.embeddedEpochs[i]) continue;
      this.#finish(seq, "stop");
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
    for (const seq of this.#inFlight.blame(failedStepId, this.config.maxSeqFaults)) {
      this.#fail(
        seq,
        `Generation failed: the engine crashed in ${seq.faults} steps that included this request (last error: ${error})`,
      );
    }
    this.#inFlight.clear();
    this.#q.requeueAll();
    this.#kv.reset();
    this.#released = []; // the new engine never saw them
    this.#counts.executorRestarts++;
  }

  /** Nothing can run any more: fail every live sequence and refuse new ones. */
  failAll(code: GenerationErrorCode, message: string): void {
    this.#healthy = false;
    this.#inFlight.clear();
    for (const seq of [...this.#q.live.values()]) {
      this.#retire(seq, { type: "failed", seqId: seq.seqId, code, message });
    }
    this.#kv.reset();
    this.#released = [];
  }

  stats(): SchedulerStats {
    const kv = this.#kv.stats();
    return {
      running: this.#q.running.length,
      waiting: this.#q.waiting.length,
      kvBlocksUsed: kv.usedBlocks,
      kvBlocksFree: kv.freeBlocks,
      kvBlocksTotal: kv.numBlocks,
      kvBlockSize: kv.blockSize,
      prefixHitTokens: kv.prefixHitTokens,
      prefixQueryTokens: kv.prefixQueryTokens,
      prefixHitRate: kv.prefixHitRate,
      evictions: kv.evictions,
      ...this.#counts,
      steps: this.#nextStepId,
      stepsInFlight: this.#inFlight.size,
      executorHealthy: this.#healthy,
      draining: this.#draining,
    };
  }

  /** Prompt rows not yet fed, and their prompts: running prompts' rest and every waiting one. */
  #prefillBacklog(): PromptBacklog {
    let rows = 0, prompts = 0;
    for (const seq of this.#q.running) {
      if (seq.pending === 0 && seq.unfed >= 2) (rows += seq.unfed, prompts++);
    }
    for (const seq of this.#q.waiting) (rows += seq.tokens.length, prompts++);
    return { rows, prompts };
  }

  /**
   * Admits waiting sequences, highest priority first, while the budget, the running cap and
   * `allowed` (the step's budget and yield rule) let them; each may preempt strictly
   * lower-ranked running work to fit. First come, first served: a later arrival does not jump
   * a request that does not fit.
   */
  #admit(allowed: (seq: Sequence) => boolean): void {
    const b = this.#build!;
    let admitted = false;
    for (const seq of byPriority(this.#q.waiting, this.#rankOf)) {
      if (!allowed(seq) || !b.roomForPrefill) break;
      if (this.#q.running.length >= this.config.maxRunning) break;
      // No room for it now, nor for those behind it.
      if (b.preempted.has(seq) && b.entries.length > 0) break;
      if (seq.held || b.barred(seq) || !maskReady(seq)) continue;
      let cached = 0, n = 0, table: readonly number[] | null = null;
      for (;;) {
        // Again after each preemption: the victim's free may have cached more of this prompt,
        // and allocateSlots takes every cached block it finds, so the plan must start after them.
        cached = this.#kv.computedPrefix(seq);
        n = Math.min(seq.tokens.length - cached, b.budget);
        const reserve = this.#q.running.length > 0 ? this.config.watermarkBlocks : 0;
        table = this.#kv.allocateSlots(seq, n, reserve);
        if (table) break;
        const victim = pickVictim(this.#q.running, seq, true, b.members, this.#rankOf);
        if (!victim) break;
        this.#preempt(victim);
      }
      if (!table) break;
      admitted = true;
      if (this.#q.start(seq, cached)) {
        this.#emit({ type: "scheduled", seqId: seq.seqId, cachedTokens: cached });
      }
      b.addPrefill(seq, n, table);
    }
    if (admitted) this.#q.settle();
  }

  /**
   * Allocates slots for a running sequence, preempting lower-priority or later-admitted ones
   * not in this step. A decode that still finds no room preempts itself; a prefill chunk waits.
   */
  #makeRoom(seq: Sequence, n: number, isDecode: boolean): readonly number[] | null {
    for (;;) {
      const table = this.#kv.allocateSlots(seq, n);
      if (table) return table;
      const victim = pickVictim(this.#q.running, seq, false, this.#build!.members, this.#rankOf);
      if (victim) {
        this.#preempt(victim);
        continue;
      }
      if (isDecode) this.#preempt(seq);
      return null;
    }
  }

  /** Frees a running sequence's blocks and puts it back in the queue, ahead of later arrivals. */
  #preempt(seq: Sequence): void {
    this.#kv.free(seq);
    this.#build!.preempted.add(seq);
    this.#q.requeue(seq);
    this.#counts.preemptions++;
    this.#released.push(seq.seqId);
  }

  /** Ends a live sequence with a finish reason (the stop token that ended it, if one did). */
  #finish(seq: Sequence, reason: FinishReason, stopToken?: number): void {
    const { seqId, numGenerated: completionTokens } = seq;
    const end = { type: "finished", seqId, reason, completionTokens } as const;
    this.#retire(seq, stopToken === undefined ? end : { ...end, stopToken });
  }

  #fail(seq: Sequence, message: string): void {
    this.#retire(seq, { type: "failed", seqId: seq.seqId, code: "internal", message });
  }

  /**
   * The one way a live sequence ends, however it ends: it leaves its queue and its blocks,
   * its in-flight results go stale, the engine may forget it, and its owner hears `event`.
   */
  #retire(seq: Sequence, event: SeqEvent): void {
    this.#kv.free(seq);
    if (seq.admitted) this.#released.push(seq.seqId); // it reached the engine
    this.#q.remove(seq);
    this.#counts.finished++;
    seq.constraint?.dispose();
    this.#emit(event);
  }
}
