import type { WasmHeap } from "./heap.ts";

/**
 * Bytes per row of each field of an activation buffer K wide, in the order of the descriptor's
 * words (ACT_* in as/quantize.ts): f32 values, Q8_0 quants, their scales and scaled sums (tiled
 * by four rows), Q8_K quants, their scales, the 16-bit sums of each 16 and each 32 quants, and
 * the Q8_0 quants widened to 16 bits.
 */
function rowBytes(K: number): number[] {
  return [K * 4, K, (K >> 5) * 4, (K >> 5) * 4, K, (K >> 8) * 4, (K >> 4) * 2, (K >> 5) * 2, K * 2];
}

const FIELDS = 9;

/** Activation rows of width K in every encoding the matmuls read, with their descriptor. */
export class ActBuffer {
  /** Address of the 8-word descriptor the kernels take. */
  readonly desc: number;
  /** Address of the f32 rows. */
  readonly f: number;
  /** Bytes held. */
  readonly bytes: number;
  readonly #ranges: [number, number][];

  /** Bytes an ActBuffer of `rows` rows of width K takes. */
  static bytesFor(rows: number, K: number): number {
    const tiled = Math.ceil(rows / 4) * 4;
    return rowBytes(K).reduce((n, b) => n + tiled * b + 64, 64);
  }

  constructor(
    private readonly heap: WasmHeap,
    readonly rows: number,
    readonly K: number,
    what: string,
  ) {
    // Padded: a field can be empty (K below a block) yet still needs an address; rows are
    // rounded up to whole tiles of four.
    const tiled = Math.ceil(rows / 4) * 4;
    this.#ranges = rowBytes(K).map((b) => {
      const n = tiled * b + 64;
      return [heap.alloc(n, what), n];
    });
    this.#ranges.push([heap.alloc(64, what), 64]);
    this.bytes = this.#ranges.reduce((n, [, b]) => n + b, 0);
    this.desc = this.#ranges[FIELDS]![0];
    this.f = this.#ranges[0]![0];
    heap.i32(this.desc, FIELDS).set(this.#ranges.slice(0, FIELDS).map(([p]) => p));
  }

  /** Writes at `at` a descriptor for rows from `from` on (the classifier's chunks); `from` is a multiple of 4. */
  writeOffsetDesc(at: number, from: number): void {
    if (from % 4 !== 0) {
      throw new Error(`Activation rows are tiled by four: cannot offset by ${from} rows`);
    }
    const d = this.heap.i32(this.desc, FIELDS);
    const per = rowBytes(this.K);
    this.heap.i32(at, FIELDS).set(per.map((b, i) => d[i]! + from * b));
  }

  free(): void {
    for (const [p, n] of this.#ranges) this.heap.free(p, n);
  }
}
