/**
 * How busy each pipeline stage is, seen from the head: a stage is busy while a micro-batch
 * sent to it is unanswered (queued at it, computed, or on the wire to and from it), and the
 * pipeline has work while any stage is busy. A stage's bubble fraction is the share of the
 * pipeline's working time it sat idle: the time micro-batches do not cover.
 */
export class StageOccupancy {
  readonly #depth: number[];
  readonly #busyMs: number[];
  #activeMs = 0;
  #last: number;

  constructor(stages: number, readonly now: () => number = () => performance.now()) {
    this.#depth = new Array(stages).fill(0);
    this.#busyMs = new Array(stages).fill(0);
    this.#last = now();
  }

  get stages(): number {
    return this.#depth.length;
  }

  /** A micro-batch was sent to `stage`. */
  sent(stage: number): void {
    this.#advance();
    this.#depth[stage]!++;
  }

  /** `stage` answered (or failed) a micro-batch. */
  answered(stage: number): void {
    this.#advance();
    this.#depth[stage] = Math.max(0, this.#depth[stage]! - 1);
  }

  /** Micro-batches sent to `stage` and not yet answered. */
  depth(stage: number): number {
    return this.#depth[stage]!;
  }

  /** Share of the time the pipeline had work that `stage` had none, 0 to 1 (0 before any work). */
  bubbleFraction(stage: number): number {
    this.#advance();
    return this.#activeMs > 0 ? 1 - this.#busyMs[stage]! / this.#activeMs : 0;
  }

  #advance(): void {
    const t = this.now();
    const dt = t - this.#last;
    this.#last = t;
    if (!this.#depth.some((d) => d > 0)) return;
    this.#activeMs += dt;
    this.#depth.forEach((d, s) => {
      if (d > 0) this.#busyMs[s]! += dt;
    });
  }
}
