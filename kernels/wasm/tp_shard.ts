/**
 * Exact tensor parallelism for the CPU engine: which output rows of each matmul a rank
 * computes, and how the ranks' outputs are gathered. Every rank computes whole output
 * elements (never a partial sum), each in the same reduction order as one process, so a TP
 * run is bit-identical to one process (docs/cluster.md, "Tensor parallelism").
 */
import type { ModelConfig } from "../../lib/model/model_config.ts";
import { byteSize, type Tensor } from "../../lib/model/tensor.ts";

/** Indices [start, end). */
export interface Span {
  readonly start: number;
  readonly end: number;
}

/** What rank `rank` of `size` computes in every layer. */
export interface TpShard {
  readonly rank: number;
  readonly size: number;
  /** Its KV heads: their attention and KV cache stay on the rank (shared past nKvHeads ranks). */
  readonly kvHeads: Span;
  /** Its query heads: those of its KV heads (wq's rows are heads × headDim). */
  readonly heads: Span;
  /** Its rows of wo and wDown: columns of the residual stream. */
  readonly dimRows: Span;
  /** Its rows of wGate and wUp: columns of the hidden (SwiGLU) rows. */
  readonly hiddenRows: Span;
}

/** Part `rank` of `size` of [0, n), as even as integers allow. */
function part(n: number, rank: number, size: number): Span {
  return { start: Math.floor(n * rank / size), end: Math.floor(n * (rank + 1) / size) };
}

/**
 * The shard of rank `rank` of `size`. Up to the model's KV-head count, ranks split the KV
 * heads (with their query heads), so each KV head and its cache live on one rank. Past it, as
 * vLLM does, the query heads of a KV head are split and each rank keeps a copy of that KV
 * head (its K/V rows computed on every such rank, its cache held there).
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const config = { dim: 64, hiddenDim: 172, nHeads: 8, nKvHeads: 4 };
 * const s = tpShard(config, 1, 2);
 * assertEquals([s.kvHeads, s.heads], [{ start: 2, end: 4 }, { start: 4, end: 8 }]);
 * assertEquals([s.dimRows, s.hiddenRows], [{ start: 32, end: 64 }, { start: 86, end: 172 }]);
 * // One KV head, 4 query heads, 2 ranks: each keeps the KV head and takes 2 query heads.
 * const t = tpShard({ ...config, nHeads: 4, nKvHeads: 1 }, 1, 2);
 * assertEquals([t.kvHeads, t.heads], [{ start: 0, end: 1 }, { start: 2, end: 4 }]);
 * ```
 */
export function tpShard(
  config: Pick<ModelConfig, "dim" | "hiddenDim" | "nHeads" | "nKvHeads">,
  rank: number,
  size: number,
): TpShard {
  const { nHeads, nKvHeads } = config;
  const group = nHeads / nKvHeads;
  const perKv = size / nKvHeads;
  const fits = size <= nKvHeads || (Number.isInteger(perKv) && group % perKv === 0);
  if (!(Number.isInteger(size) && size >= 1 && fits)) {
    throw new Error(
      `Invalid tensor-parallel size ${size}: expected an integer up to the model's ${nKvHeads} ` +
        `KV heads, or a multiple of them that divides each KV head's ${group} query heads`,
    );
  }
  if (!(Number.isInteger(rank) && rank >= 0 && rank < size)) {
    throw new Error(`Invalid tensor-parallel rank ${rank}: expected an integer in 0..${size - 1}`);
  }
  let kvHeads: Span, heads: Span;
  if (size <= nKvHeads) {
    kvHeads = part(nKvHeads, rank, size);
    heads = { start: kvHeads.start * group, end: kvHeads.end * group };
  } else {
    const kv = Math.floor(rank / perKv), share = group / perKv, j = rank % perKv;
    kvHeads = { start: kv, end: kv + 1 };
    heads = { start: kv * group + j * share, end: kv * group + (j + 1) * share };
  }
  return {
    rank,
    size,
    kvHeads,
    heads,
    dimRows: part(config.dim, rank, size),
    hiddenRows: part(config.hiddenDim, rank, size),
  };
}

/** Rows [start, end) of a 2-D tensor, as a view of its bytes (rows are contiguous). */
export function rowSlice(t: Tensor, start: number, end: number): Tensor {
  const [rows, cols] = t.shape as [number, number];
  if (t.shape.length !== 2 || !(0 <= start && start < end && end <= rows)) {
    throw new Error(
      `Cannot take rows ${start}-${end} of '${t.name}' of shape [${t.shape.join(", ")}]`,
    );
  }
  const rb = byteSize(t.type, [cols]);
  return {
    name: `${t.name}[${start}:${end}]`,
    type: t.type,
    shape: [end - start, cols],
    data: t.data.subarray(start * rb, end * rb),
  };
}

/**
 * How a rank swaps its slice of a gather for everyone's: `local` is its rows × its columns,
 * packed; the answer is every rank's, in rank order. Calls match across ranks by their order.
 */
export interface TpExchange {
  exchange(local: Float32Array): Promise<readonly Float32Array[]>;
}

/** Columns `span` of `rows` rows of `stride` values, packed. */
export function packColumns(full: Float32Array, stride: number, rows: number, span: Span) {
  const w = span.end - span.start;
  const out = new Float32Array(rows * w);
  for (let r = 0; r < rows; r++) {
    out.set(full.subarray(r * stride + span.start, r * stride + span.end), r * w);
  }
  return out;
}

/** Writes each rank's packed columns (`parts[j]` at `spans[j]`) into `full`. */
export function scatterColumns(
  full: Float32Array,
  stride: number,
  rows: number,
  parts: readonly Float32Array[],
  spans: readonly Span[],
): void {
  parts.forEach((p, j) => {
    const { start, end } = spans[j]!, w = end - start;
    if (p.length !== rows * w) {
      throw new Error(
        `Invalid gather from tensor-parallel rank ${j}: expected ${rows} rows of ${w} values, ` +
          `received ${p.length} values`,
      );
    }
    for (let r = 0; r < rows; r++) full.set(p.subarray(r * w, (r + 1) * w), r * stride + start);
  });
}

/**
 * The ranks of one process's TP group: each member's n-th exchange waits for every member's
 * n-th and answers all of them (how tests and one-process TP gather; a remote group goes over
 * a link instead).
 */
export class LocalTpGroup {
  readonly #rounds: {
    parts: (Float32Array | undefined)[];
    done: (v: Float32Array[]) => void;
    all: Promise<Float32Array[]>;
  }[] = [];
  readonly #next: number[];
  constructor(readonly size: number) {
    this.#next = new Array(size).fill(0);
  }

  member(rank: number): TpExchange {
    return {
      exchange: (local) => {
        const n = this.#next[rank]!++;
        let round = this.#rounds[n];
        if (!round) {
          let done!: (v: Float32Array[]) => void;
          const all = new Promise<Float32Array[]>((r) => (done = r));
          round = this.#rounds[n] = { parts: new Array(this.size).fill(undefined), done, all };
        }
        round.parts[rank] = local;
        if (round.parts.every((p) => p !== undefined)) {
          round.done(round.parts as Float32Array[]);
          delete this.#rounds[n];
        }
        return round.all;
      },
    };
  }
}
