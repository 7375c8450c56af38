import type { PagedKvCache } from "./paged_kv_cache.ts";

/**
 * Causal grouped-query attention of one query row at position `pos` over positions 0..pos of a
 * sequence, reading K and V through its block table. Query head h reads KV head
 * floor(h / (nHeads / nKvHeads)), as llama2.c does. Scores are q·k / sqrt(headDim), softmaxed in
 * double precision; `out` receives nHeads * headDim values.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { PagedKvCache } from "./paged_kv_cache.ts";
 *
 * // One layer, one KV head of 2, blocks of 2 slots: positions 0 and 1 of the sequence live in
 * // block 3, position 2 in block 1.
 * const kv = new PagedKvCache(1, 1, 2, { numBlocks: 4, blockSize: 2 });
 * const table = [3, 1];
 * [[1, 0], [0, 1], [2, 2]].forEach((v, pos) => kv.value(0).set(v, kv.slotOffset(table, pos)));
 * // The keys are all zero, so every position scores the same: out is the mean of the values.
 * const out = pagedAttention(new Float32Array(2), new Float32Array([1, 1]), kv, 0, table, 2, 1);
 * assertEquals([...out], [1, 1]);
 * ```
 */
export function pagedAttention(
  out: Float32Array,
  q: Float32Array,
  cache: PagedKvCache,
  layer: number,
  blockTable: readonly number[],
  pos: number,
  nHeads: number,
): Float32Array {
  const { headDim, nKvHeads } = cache;
  if (q.length !== nHeads * headDim || out.length !== q.length || nHeads % nKvHeads !== 0) {
    throw new Error(
      `Cannot attend: q and out must hold ${nHeads} heads x ${headDim}, received ${q.length} and ${out.length}; nHeads must be a multiple of nKvHeads ${nKvHeads}`,
    );
  }
  const keys = cache.key(layer);
  const values = cache.value(layer);
  const group = nHeads / nKvHeads;
  const scale = 1 / Math.sqrt(headDim);
  const offsets = Array.from({ length: pos + 1 }, (_, t) => cache.slotOffset(blockTable, t));
  const scores = new Float64Array(pos + 1);
  const acc = new Float64Array(headDim);
  for (let h = 0; h < nHeads; h++) {
    const qBase = h * headDim;
    const kvHead = Math.floor(h / group) * headDim;
    let max = -Infinity;
    for (let t = 0; t <= pos; t++) {
      const kBase = offsets[t]! + kvHead;
      let dot = 0;
      for (let i = 0; i < headDim; i++) dot += q[qBase + i]! * keys[kBase + i]!;
      scores[t] = dot * scale;
      max = Math.max(max, scores[t]!);
    }
    let sum = 0;
    for (let t = 0; t <= pos; t++) {
      scores[t] = Math.exp(scores[t]! - max);
      sum += scores[t]!;
    }
    acc.fill(0);
    for (let t = 0; t <= pos; t++) {
      const a = scores[t]! / sum;
      const vBase = offsets[t]! + kvHead;
      for (let i = 0; i < headDim; i++) acc[i] = acc[i]! + a * values[vBase + i]!;
    }
    for (let i = 0; i < headDim; i++) out[qBase + i] = acc[i]!;
  }
  return out;
}
