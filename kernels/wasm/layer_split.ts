/**
 * How a model is split over the CPU engine's memories: a wasm32 memory addresses 4 GiB, and the
 * files people run (an 8B model at Q4_K_M is 4.9 GB) hold more. Each memory gets a contiguous
 * range of layers, with their weights, their KV cache and its own step buffers; the first
 * also holds what comes before the layers, the last what comes after (the classifier).
 */

import type { LayerRange } from "../../lib/engine/stage_link.ts";

export type { LayerRange };

/** What one layer (with what rides along with the first or last) puts in its memory. */
export interface SplitUnit {
  readonly bytes: number;
  /** For the error when it cannot fit alone: e.g. "layer 31 with 'output.weight' (430940160 bytes)". */
  readonly what: string;
}

/** Parts a greedy fill of `units` in order makes under `cap` bytes each. */
function greedy(units: readonly SplitUnit[], cap: number): LayerRange[] {
  const ranges: LayerRange[] = [];
  let start = 0, sum = 0;
  units.forEach((u, i) => {
    if (i > start && sum + u.bytes > cap) {
      ranges.push({ start, end: i });
      start = i;
      sum = 0;
    }
    sum += u.bytes;
  });
  ranges.push({ start, end: units.length });
  return ranges;
}

/**
 * Splits layers over the fewest memories of `cap` bytes that hold them, each also holding
 * `each` bytes (step buffers, the kernels' static data), and balances the ranges: the largest
 * is as small as that many memories allow, so each keeps room for its KV cache.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const units = [10, 10, 10, 10, 10].map((bytes, i) => ({ bytes, what: `layer ${i}` }));
 * // 50 bytes in memories of 35 (5 of them step buffers): two, of 3 and 2 layers.
 * assertEquals(splitLayers(units, 5, 35), [{ start: 0, end: 3 }, { start: 3, end: 5 }]);
 * ```
 */
export function splitLayers(units: readonly SplitUnit[], each: number, cap: number): LayerRange[] {
  const room = cap - each;
  const biggest = units.reduce((a, u) => (u.bytes > a.bytes ? u : a), units[0]!);
  if (biggest.bytes > room) {
    throw new Error(
      `Cannot split the model over CPU engine memories of ${cap} bytes: ${biggest.what} needs ${biggest.bytes} bytes, ` +
        `and only ${
          Math.max(0, room)
        } are left in one memory beside its ${each} bytes of step buffers`,
    );
  }
  const k = greedy(units, room).length;
  // The smallest largest-part that still needs no more than k memories.
  let lo = biggest.bytes, hi = room;
  while (lo < hi) {
    const mid = Math.floor((lo + hi) / 2);
    if (greedy(units, mid).length <= k) hi = mid;
    else lo = mid + 1;
  }
  return greedy(units, lo);
}
