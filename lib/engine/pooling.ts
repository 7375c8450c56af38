import type { HiddenRows, HiddenStates } from "./engine.ts";
import type { Pooling } from "../model/pooling_type.ts";

export type { Pooling };

/**
 * Which rows of a prompt chunk at [start, end) of a prompt of `length` tokens the engine must
 * return for `pooling`; undefined: none.
 */
export function hiddenRowsFor(
  pooling: Pooling,
  start: number,
  end: number,
  length: number,
): HiddenRows | undefined {
  if (pooling === "mean") return "all";
  if (pooling === "last") return end === length ? "last" : undefined;
  return start === 0 ? "all" : undefined;
}

/**
 * Gathers one sequence's pooled hidden state from the rows its steps return, in step order.
 * A chunk starting at position 0 starts afresh: a preempted sequence is computed again from
 * its first token.
 */
export class Pooler {
  readonly #sum: Float64Array;
  #rows = 0;
  #last: Float32Array | undefined;

  constructor(readonly pooling: Pooling, readonly dim: number) {
    this.#sum = new Float64Array(dim);
  }

  add(h: HiddenStates): void {
    const { dim } = this;
    const n = h.rows.length / dim;
    if (h.startPos === 0) (this.#sum.fill(0), this.#rows = 0);
    if (this.pooling === "cls") {
      if (h.startPos === 0) this.#last = h.rows.slice(0, dim);
      return;
    }
    if (this.pooling === "last") {
      this.#last = h.rows.slice((n - 1) * dim, n * dim);
      return;
    }
    for (let r = 0; r < n; r++) {
      for (let j = 0; j < dim; j++) this.#sum[j]! += h.rows[r * dim + j]!;
    }
    this.#rows += n;
  }

  /** The pooled vector (not normalized); throws when no row came. */
  result(): Float32Array {
    if (this.pooling !== "mean") {
      if (!this.#last) throw new Error(`No hidden state came for ${this.pooling} pooling`);
      return this.#last;
    }
    if (this.#rows === 0) throw new Error("No hidden state came for mean pooling");
    return Float32Array.from(this.#sum, (v) => v / this.#rows);
  }
}
