import type { HiddenRows, HiddenStates } from "./engine.ts";

/**
 * How a sequence's hidden states become one embedding, as llama.cpp's `pooling_type` says
 * (GGUF `<arch>.pooling_type`: 1 mean, 2 cls, 3 last): the mean of every row, the first row,
 * or the last row.
 */
export type Pooling = "mean" | "cls" | "last";

/** The poolings, in the order of their GGUF codes 1, 2, 3. */
export const POOLINGS: readonly Pooling[] = ["mean", "cls", "last"];

/**
 * The pooling a GGUF `pooling_type` code names; undefined for none (0), rank (4) and
 * unspecified (-1 or absent), which do not give one vector per input.
 */
export function poolingOfCode(code: number | undefined): Pooling | undefined {
  return code !== undefined && code >= 1 && code <= 3 ? POOLINGS[code - 1] : undefined;
}

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
