import type { SeqInput, StepResult } from "../engine/engine.ts";
import type { Sequence } from "./sequence.ts";
import { hiddenRowsFor } from "../engine/pooling.ts";

/** Crashed steps after which a sequence runs as the only suspect of its step, to settle blame. */
export const ISOLATE_AFTER_FAULTS = 2;

const NO_TOKENS: readonly number[] = Object.freeze([]);

/** A planned step whose result has not come back. */
export interface InFlightStep {
  /** Every sequence in the plan (the suspects if the step crashes the engine). */
  readonly all: Sequence[];
  /** The one repeat suspect allowed in this step: if the step crashes, it alone is blamed. */
  isolated?: Sequence;
  /** The sampling entries of the plan, in plan order... */
  readonly seqs: Sequence[];
  /** ...each with the epoch it was planned under (parallel arrays: no object per entry). */
  readonly epochs: number[];
  /** The entries that return hidden states (embeddings), in plan order, and their epochs. */
  readonly hidden: Sequence[];
  readonly hiddenEpochs: number[];
  /** Embeddings whose last prompt token is in the step, and their epochs. */
  readonly embedded: Sequence[];
  readonly embeddedEpochs: number[];
  /** Token rows of the step (what its cost is measured against). */
  rows: number;
}

/** An unconstrained sequence, or a constrained one whose next mask is known. */
export function maskReady(seq: Sequence): boolean {
  return !seq.constraint || seq.mask !== undefined;
}

/**
 * One step being planned: its entries under the token budget, which sequences it holds, and
 * which rows each may add. What the scheduler adds and in which order is its policy; this is
 * the bookkeeping of a plan.
 */
export class StepBuild {
  readonly entries: SeqInput[] = [];
  readonly record: InFlightStep = {
    all: [],
    seqs: [],
    epochs: [],
    hidden: [],
    hiddenEpochs: [],
    embedded: [],
    embeddedEpochs: [],
    rows: 0,
  };
  /** Sequences in the step: never preempted to make room for another. */
  readonly members = new Set<Sequence>();
  /**
   * Sequences preempted to make room while building it. They wait for a later step (so a
   * preemption is not undone at once), unless this step would otherwise be empty.
   */
  readonly preempted = new Set<Sequence>();
  budget: number;
  /** Prompt rows (prefill chunks) in the step so far. */
  prefillRows = 0;
  /** Prompt rows after which no further prompt starts a chunk in this step (see StepCost). */
  burstRows = Infinity;

  constructor(
    readonly stepId: number,
    readonly maxTokens: number,
    readonly lateMasks = false,
  ) {
    this.budget = maxTokens;
  }

  /**
   * Whether one more prompt's chunk joins the step: the first always does; the next only while
   * the step's prompt rows are below burstRows, so a burst is cut between prompts, never
   * inside one, and each prompt's first token comes at the end of its own step.
   */
  get roomForPrefill(): boolean {
    return this.budget > 0 && (this.prefillRows === 0 || this.prefillRows < this.burstRows);
  }

  /** A repeat suspect shares a step with no other suspect, so a crash there names the culprit. */
  barred(seq: Sequence): boolean {
    return seq.faults >= ISOLATE_AFTER_FAULTS && this.record.isolated !== undefined;
  }

  /**
   * Running, with one token to feed (known, or sampled in flight), and room to sample one more.
   * A constrained sequence's next mask depends on the token it sampled last, so it decodes only
   * once that token is here and its grammar has seen it, or, with late masks, feeds its token in
   * flight and gets the mask that follows it while the step runs (one such mask at a time).
   */
  wantsDecode(seq: Sequence): boolean {
    const ready = seq.constraint
      ? seq.pending === 0
        ? seq.unfed === 1 && seq.mask !== undefined
        : this.lateMasks && !seq.needsKnownTokens && seq.late === undefined
      : seq.needsKnownTokens
      ? seq.pending === 0 && seq.unfed === 1
      : seq.pending > 0 || seq.unfed === 1;
    return seq.status === "running" && !seq.held && ready && seq.canSample && !this.barred(seq);
  }

  /**
   * Running, not yet in this step, with known tokens to feed (a prompt or a recomputation).
   * An embedding's last prompt token is a prefill too: it samples nothing.
   */
  wantsPrefill(seq: Sequence): boolean {
    return seq.status === "running" && !seq.held && !this.members.has(seq) &&
      seq.pending === 0 && seq.unfed >= (seq.embed ? 1 : 2) && maskReady(seq) &&
      !this.barred(seq);
  }

  /** Adds a chunk of n known tokens of a prompt (or a recomputation) to the step. */
  addPrefill(seq: Sequence, n: number, table: readonly number[]): void {
    this.add(seq, n, table);
    this.prefillRows += n;
  }

  /** Adds n of the sequence's tokens (or its last sampled one) to the step. */
  add(seq: Sequence, n: number, table: readonly number[]): void {
    if (seq.faults >= ISOLATE_AFTER_FAULTS) this.record.isolated = seq;
    const start = seq.numScheduled;
    const useLastSampled = seq.pending > 0;
    const sample = !seq.embed && (useLastSampled || start + n === seq.tokens.length);
    const hidden = seq.embed && hiddenRowsFor(seq.embed, start, start + n, seq.tokens.length);
    const adjust = sample ? seq.penalties?.adjust(start + n) : undefined;
    // A constrained decode of its token in flight: its mask is the one after that token.
    let late: Promise<Uint32Array> | undefined;
    if (sample && seq.constraint && useLastSampled) {
      let resolve!: (m: Uint32Array) => void;
      late = new Promise<Uint32Array>((r) => resolve = r);
      seq.late = { promise: late, resolve };
    }
    this.entries.push({
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
      ...(hidden ? { hidden } : {}),
    });
    if (hidden) {
      this.record.hidden.push(seq);
      this.record.hiddenEpochs.push(seq.epoch);
    }
    if (seq.embed && start + n === seq.tokens.length) {
      this.record.embedded.push(seq);
      this.record.embeddedEpochs.push(seq.epoch);
    }
    seq.numScheduled += n;
    this.record.rows += n;
    this.members.add(seq);
    this.record.all.push(seq);
    if (sample) {
      seq.pending++;
      this.record.seqs.push(seq);
      this.record.epochs.push(seq.epoch);
    }
    this.budget -= n;
  }
}

/** Planned steps whose results have not come back, oldest first. */
export class InFlightSteps {
  #steps = new Map<number, InFlightStep>();

  get size(): number {
    return this.#steps.size;
  }

  add(stepId: number, rec: InFlightStep): void {
    this.#steps.set(stepId, rec);
  }

  /**
   * Removes and returns the record of the step `result` answers; undefined for a step
   * forgotten since (lost to an executor failure). Throws when results come out of step order
   * or do not match their plan.
   */
  take(result: StepResult): InFlightStep | undefined {
    const rec = this.#steps.get(result.stepId);
    if (!rec) return undefined;
    const oldest = this.#steps.keys().next().value;
    if (oldest !== result.stepId) {
      throw new Error(`Scheduler: result of step ${result.stepId} arrived before step ${oldest}'s`);
    }
    this.#steps.delete(result.stepId);
    checkResult(result, rec);
    return rec;
  }

  /**
   * Blames the step that crashed the engine: a fault for its isolated suspect, else for every
   * sequence in it still running. Returns those that reached `maxFaults`, to be failed.
   */
  blame(stepId: number | undefined, maxFaults: number): Sequence[] {
    const rec = stepId === undefined ? undefined : this.#steps.get(stepId);
    const suspects = rec?.isolated ? [rec.isolated] : rec?.all ?? [];
    return suspects.filter((seq) => seq.status === "running" && ++seq.faults >= maxFaults);
  }

  clear(): void {
    this.#steps.clear();
  }
}

/** Throws unless `result` answers `rec`'s plan entry for entry. */
function checkResult(result: StepResult, rec: InFlightStep): void {
  const hidden = result.hidden ?? [];
  if (
    hidden.length !== rec.hidden.length || hidden.some((h, i) => h.seqId !== rec.hidden[i]!.seqId)
  ) {
    throw new Error(
      `Scheduler: step ${result.stepId} returned hidden states for seqs [${
        hidden.map((h) => h.seqId)
      }], its plan asked for [${rec.hidden.map((s) => s.seqId)}]`,
    );
  }
  if (result.sampled.length !== rec.seqs.length) {
    throw new Error(
      `Scheduler: step ${result.stepId} returned ${result.sampled.length} sampled tokens, its plan asked for ${rec.seqs.length}`,
    );
  }
  for (let i = 0; i < rec.seqs.length; i++) {
    const seqId = result.sampled[i]!.seqId, want = rec.seqs[i]!.seqId;
    if (seqId !== want) {
      throw new Error(
        `Scheduler: step ${result.stepId} entry ${i} is for seq ${seqId}, the plan had seq ${want}`,
      );
    }
  }
}
