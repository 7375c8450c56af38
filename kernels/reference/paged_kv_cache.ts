import type { KvGeometry } from "../../lib/engine/engine.ts";

/**
 * Per-layer K and V pools shaped [numBlocks, blockSize, nKvHeads, headDim], the same layout the
 * GPU engine keeps. A sequence's position p lives in block blockTable[floor(p / blockSize)] at
 * offset p % blockSize; no sequence owns a contiguous region.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * // 5 layers of 4 KV heads of 8: a token's slot holds 32 floats.
 * const kv = new PagedKvCache(5, 4, 8, { numBlocks: 64, blockSize: 16 });
 * // Position 17 of a sequence whose block table is [3, 9]: block 9, offset 1.
 * const at = kv.slotOffset([3, 9], 17);
 * assertEquals(at, (9 * 16 + 1) * kv.rowSize);
 * const key = kv.key(0).subarray(at, at + kv.rowSize); // that token's key in layer 0
 * assertEquals(key.length, 32);
 * ```
 */
export class PagedKvCache {
  readonly keys: Float32Array[];
  readonly values: Float32Array[];
  /** Floats per token slot: nKvHeads * headDim. */
  readonly rowSize: number;

  constructor(
    readonly nLayers: number,
    readonly nKvHeads: number,
    readonly headDim: number,
    readonly geometry: KvGeometry,
  ) {
    const { numBlocks, blockSize } = geometry;
    if (
      !(Number.isInteger(numBlocks) && numBlocks > 0 && Number.isInteger(blockSize) &&
        blockSize > 0)
    ) {
      throw new Error(
        `Cannot create KV cache: numBlocks and blockSize must be positive integers, received ${numBlocks} and ${blockSize}`,
      );
    }
    this.rowSize = nKvHeads * headDim;
    const floats = numBlocks * blockSize * this.rowSize;
    const reused = takeReleased(2 * nLayers, floats);
    this.keys = reused?.slice(0, nLayers) ??
      Array.from({ length: nLayers }, () => new Float32Array(floats));
    this.values = reused?.slice(nLayers) ??
      Array.from({ length: nLayers }, () => new Float32Array(floats));
  }

  /**
   * Hands the pools to the next cache of the same shape; this one must not be used again. An
   * engine that is rebuilt after a fault (the executor disposes the old one, then builds the
   * new) then reuses one set of pools instead of allocating another each time: V8 frees large
   * typed arrays only when a GC happens to run, so 30 restarts with a 64 MiB cache grew the
   * process by 260 MiB.
   */
  release(): void {
    released.push([...this.keys, ...this.values]);
    while (released.length > MAX_RELEASED) released.shift();
    (this as { keys: Float32Array[] }).keys = [];
    (this as { values: Float32Array[] }).values = [];
  }

  key(layer: number): Float32Array {
    return this.keys[layer]!;
  }

  value(layer: number): Float32Array {
    return this.values[layer]!;
  }

  /** Copies whole blocks, every layer's K and V, in order ([source, destination] pairs). */
  copyBlocks(pairs: readonly (readonly [number, number])[]): void {
    const n = this.geometry.blockSize * this.rowSize;
    for (const [src, dst] of pairs) {
      for (const pool of [...this.keys, ...this.values]) {
        pool.copyWithin(dst * n, src * n, (src + 1) * n);
      }
    }
  }

  /** Float offset of position `pos`'s row within a layer's pool, through a block table. */
  slotOffset(blockTable: readonly number[], pos: number): number {
    const { blockSize, numBlocks } = this.geometry;
    const block = blockTable[Math.floor(pos / blockSize)];
    if (block === undefined || !(Number.isInteger(block) && block >= 0 && block < numBlocks)) {
      throw new Error(
        `Cannot address KV slot: position ${pos} needs entry ${
          Math.floor(pos / blockSize)
        } of a block table of ${blockTable.length} holding a block id in 0..${
          numBlocks - 1
        }, received ${block}`,
      );
    }
    return (block * blockSize + (pos % blockSize)) * this.rowSize;
  }
}

/** Pools released by disposed caches, newest last; at most two sets kept. */
const released: Float32Array[][] = [];
const MAX_RELEASED = 2;

/** A released set of `count` pools of `floats` each, zeroed, or undefined. */
function takeReleased(count: number, floats: number): Float32Array[] | undefined {
  const at = released.findIndex((set) =>
    set.length === count && set.every((a) => a.length === floats)
  );
  if (at < 0) return undefined;
  const [set] = released.splice(at, 1);
  for (const a of set!) a.fill(0);
  return set;
}
