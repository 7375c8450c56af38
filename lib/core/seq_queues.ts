import type { Sequence } from "./sequence.ts";

/**
 * The scheduler's sequence state: every live sequence by id, the queue waiting for admission
 * (in arrival order) and the running set (in admission order), and the moves between them.
 * A sequence is waiting, then running (admitted: it holds KV blocks and enters steps), maybe
 * back to waiting (preempted or its engine lost), and finally gone.
 */
export class SeqQueues {
  readonly live = new Map<number, Sequence>();

  /** `maskWords`: the size of a token mask, for settling a stale late mask. */
  constructor(readonly maskWords = 1) {}
  #waiting: Sequence[] = [];
  #running: Sequence[] = [];
  #admissions = 0;

  get waiting(): readonly Sequence[] {
    return this.#waiting;
  }

  get running(): readonly Sequence[] {
    return this.#running;
  }

  /** A new arrival, at the end of the queue. */
  add(seq: Sequence): void {
    this.live.set(seq.seqId, seq);
    this.#waiting.push(seq);
  }

  /**
   * Admits a waiting sequence whose first `numScheduled` tokens are already in its KV blocks;
   * true the first time (not after a preemption).
   */
  start(seq: Sequence, numScheduled: number): boolean {
    const first = !seq.admitted;
    seq.admitted = true;
    seq.status = "running";
    seq.admitOrder = this.#admissions++;
    seq.numScheduled = numScheduled;
    this.#running.push(seq);
    return first;
  }

  /** Drops the sequences start() admitted from the queue (once per admission round). */
  settle(): void {
    this.#waiting = this.#waiting.filter((s) => s.status === "waiting");
  }

  /** Back to the queue, ahead of later arrivals, to be recomputed; its results go stale. */
  requeue(seq: Sequence): void {
    const i = this.#running.indexOf(seq);
    if (i >= 0) this.#running.splice(i, 1);
    this.#enqueue(seq);
  }

  /** Every running sequence back to the queue (the engine and its KV cache are gone). */
  requeueAll(): void {
    for (const seq of this.#running) this.#enqueue(seq);
    this.#running = [];
  }

  /** Gone for good: out of its queue, finished, its in-flight results stale. */
  remove(seq: Sequence): void {
    const queue = seq.status === "running" ? this.#running : this.#waiting;
    const i = queue.indexOf(seq);
    if (i >= 0) queue.splice(i, 1);
    this.#settleLate(seq);
    seq.status = "finished";
    seq.epoch++;
    this.live.delete(seq.seqId);
  }

  /**
   * Its step in flight is stale (the sequence ended or goes back to the queue): the engine still
   * waits for that step's mask, so it gets one allowing every id (the token is dropped).
   */
  #settleLate(seq: Sequence): void {
    if (!seq.late) return;
    seq.late.resolve(new Uint32Array(seq.mask?.length ?? this.maskWords).fill(0xffffffff));
    seq.late = undefined;
  }

  #enqueue(seq: Sequence): void {
    this.#settleLate(seq);
    seq.status = "waiting";
    seq.numScheduled = 0;
    seq.pending = 0;
    seq.epoch++;
    let i = this.#waiting.length;
    while (i > 0 && this.#waiting[i - 1]!.arrivalOrder > seq.arrivalOrder) i--;
    this.#waiting.splice(i, 0, seq);
  }
}
