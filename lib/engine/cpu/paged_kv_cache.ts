import type { KvGeometry } from "../engine.ts";

/**
 * Per-layer K and V pools shaped [numBlocks, blockSize, nKvHeads, headDim], the same layout the
 * GPU engine keeps. A sequence's position p lives in block blockTable[floor(p / blockSize)] at
 * offset p % blockSize; no sequence owns a contiguous region.
 *
 * ```ts
 * const kv = new PagedKvCache(5, 4, 8, { numBlocks: 64, blockSize: 16 });
 * kv.key(0).subarray(kv.slotOffset([3, 9], 17), kv.slotOffset([3, 9], 17) + kv.rowSize); // block 9, offset 1
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
    this.keys = Array.from({ length: nLayers }, () => new Float32Array(floats));
    this.values = Array.from({ length: nLayers }, () => new Float32Array(floats));
  }

  key(layer: number): Float32Array {
    return this.keys[layer]!;
  }

  value(layer: number): Float32Array {
    return this.values[layer]!;
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
