/**
 * The index of the cache for similar questions: unit vectors packed in one Float32Array, each
 * with the context it was asked in (an opaque string: the tenant, the model, the sampling
 * settings and the conversation before the question) and a payload. A lookup is a brute-force
 * cosine over the vectors of the same context, exact and fast at the sizes a server keeps
 * (bench/similar_index_bench.ts). Bounded in bytes; the least recently used entry goes first.
 */
export interface SimilarMatch<T> {
  readonly payload: T;
  /** Cosine similarity of the two (unit) vectors. */
  readonly score: number;
}

interface Slot<T> {
  readonly context: string;
  readonly payload: T;
  readonly bytes: number;
}

/** Bytes an entry costs besides its vector and payload (the maps' entries, the slot object). */
const ENTRY_OVERHEAD = 160;

export class SimilarIndex<T> {
  #vectors: Float32Array;
  /** Context hash of each row: rows of other contexts are skipped without a string compare. */
  #hashes: Uint32Array;
  readonly #slots: (Slot<T> | undefined)[] = [];
  /** Row of each live entry, least recently used first (a Map keeps insertion order). */
  readonly #lru = new Map<number, true>();
  readonly #free: number[] = [];
  #bytes = 0;

  constructor(
    readonly dim: number,
    readonly capacityBytes: number,
    /** What a payload costs, in bytes. */
    readonly payloadBytes: (payload: T) => number,
  ) {
    this.#vectors = new Float32Array(dim * 64);
    this.#hashes = new Uint32Array(64);
  }

  get size(): number {
    return this.#lru.size;
  }

  get bytes(): number {
    return this.#bytes;
  }

  /**
   * The closest entry of `context` to the unit vector `v`, if any, with its score; it becomes
   * the most recently used.
   */
  nearest(context: string, v: Float32Array): SimilarMatch<T> | undefined {
    this.#checkDim(v);
    const h = hashString(context);
    const { dim } = this;
    const vs = this.#vectors;
    let best = -1, bestScore = -Infinity;
    const hs = this.#hashes;
    for (let row = 0; row < this.#slots.length; row++) {
      if (hs[row] !== h || this.#slots[row] === undefined) continue;
      const dot = dotAt(vs, row * dim, v);
      if (dot > bestScore && this.#slots[row]!.context === context) (best = row, bestScore = dot);
    }
    if (best < 0) return undefined;
    this.#touch(best);
    return { payload: this.#slots[best]!.payload, score: bestScore };
  }

  /** Adds an entry; older ones are dropped while the index is over its capacity. */
  add(context: string, v: Float32Array, payload: T): void {
    this.#checkDim(v);
    const bytes = this.dim * 4 + 2 * context.length + this.payloadBytes(payload) + ENTRY_OVERHEAD;
    if (bytes > this.capacityBytes) return;
    while (this.#bytes + bytes > this.capacityBytes) this.#evictOldest();
    const row = this.#free.pop() ?? this.#grow();
    this.#vectors.set(v, row * this.dim);
    this.#hashes[row] = hashString(context);
    this.#slots[row] = { context, payload, bytes };
    this.#lru.set(row, true);
    this.#bytes += bytes;
  }

  #touch(row: number): void {
    this.#lru.delete(row);
    this.#lru.set(row, true);
  }

  #evictOldest(): void {
    const row = this.#lru.keys().next().value!;
    this.#lru.delete(row);
    this.#bytes -= this.#slots[row]!.bytes;
    this.#slots[row] = undefined;
    this.#free.push(row);
  }

  /** A new row at the end, doubling the packed arrays when they are full. */
  #grow(): number {
    const row = this.#slots.length;
    this.#slots.push(undefined);
    if (row >= this.#hashes.length) {
      const vectors = new Float32Array(this.#vectors.length * 2);
      vectors.set(this.#vectors);
      this.#vectors = vectors;
      const hashes = new Uint32Array(this.#hashes.length * 2);
      hashes.set(this.#hashes);
      this.#hashes = hashes;
    }
    return row;
  }

  #checkDim(v: Float32Array): void {
    if (v.length !== this.dim) {
      throw new RangeError(
        `A similar-cache vector has ${v.length} values, the index holds ${this.dim}`,
      );
    }
  }
}

/**
 * The dot product of `v` with the row of `vs` at `off`, in four running sums (the JIT keeps
 * them in registers; one sum made each step wait on the last).
 */
function dotAt(vs: Float32Array, off: number, v: Float32Array): number {
  let a = 0, b = 0, c = 0, d = 0;
  const n = v.length - (v.length % 4);
  for (let j = 0; j < n; j += 4) {
    a += vs[off + j]! * v[j]!;
    b += vs[off + j + 1]! * v[j + 1]!;
    c += vs[off + j + 2]! * v[j + 2]!;
    d += vs[off + j + 3]! * v[j + 3]!;
  }
  for (let j = n; j < v.length; j++) a += vs[off + j]! * v[j]!;
  return a + b + c + d;
}

/** FNV-1a over the string's UTF-16 code units. */
function hashString(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return h >>> 0;
}
