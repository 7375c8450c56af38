/** What a block holds for sharing: which tokens' KV, after which prefix. */
export interface BlockContent {
  /** Chained hash of every block before it (its chain's root for a first block). */
  readonly parentHash: number;
  /** The block before it in the table that wrote it, or NO_PARENT for a first block. */
  readonly parent: number;
  /** Its chain's root (cache scope): content is shared within one root only. */
  readonly root: number;
  /** The token ids whose KV it holds, from its first slot: all of them for a full block. */
  readonly tokens: ArrayLike<number>;
}

/** `BlockContent.parent` of a sequence's first block. */
export const NO_PARENT = -1;

/** The best partial match of a block: the block to copy and how many leading slots it gives. */
export interface BlockMatch {
  readonly block: number;
  readonly length: number;
}

const NO_MATCH: BlockMatch = { block: -1, length: 0 };

/**
 * The blocks that follow each prefix, full (cached) or partly filled (a sequence's tail), by the
 * chained hash of that prefix: where the prefix cache looks for the longest run of a prompt's
 * tokens past its last whole cached block. A candidate counts only when its parent block and
 * root are the very ones the prompt matched, so a hash collision never shares foreign KV.
 *
 * @example
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const children = new BlockChildren();
 * children.set(7, { parentHash: 99, parent: 3, root: 1, tokens: [5, 6, 8] });
 * // A prompt whose block after block 3 reads 5, 6, 9, 10: two slots of block 7 are its own.
 * assertEquals(children.longestMatch(99, 3, 1, [5, 6, 9, 10], 0, 4), { block: 7, length: 2 });
 * ```
 */
export class BlockChildren {
  #byParent = new Map<number, Set<number>>();
  #content = new Map<number, BlockContent>();

  /** Whether the block holds content recorded here. */
  has(block: number): boolean {
    return this.#content.has(block);
  }

  /** Records (or replaces) what the block holds. */
  set(block: number, content: BlockContent): void {
    const old = this.#content.get(block);
    if (old && old.parentHash !== content.parentHash) this.#unlink(block, old.parentHash);
    this.#content.set(block, content);
    let set = this.#byParent.get(content.parentHash);
    if (!set) this.#byParent.set(content.parentHash, set = new Set());
    set.add(block);
  }

  /** Forgets the block's content (it is rewritten or evicted). */
  delete(block: number): void {
    const old = this.#content.get(block);
    if (!old) return;
    this.#content.delete(block);
    this.#unlink(block, old.parentHash);
  }

  clear(): void {
    this.#byParent.clear();
    this.#content.clear();
  }

  /**
   * The child of (parentHash, parent, root) sharing the most leading tokens with
   * tokens[from, from + limit), or block -1 and length 0 when none shares one.
   */
  longestMatch(
    parentHash: number,
    parent: number,
    root: number,
    tokens: readonly number[],
    from: number,
    limit: number,
  ): BlockMatch {
    let best = NO_MATCH;
    for (const block of this.#byParent.get(parentHash) ?? []) {
      const c = this.#content.get(block)!;
      if (c.parent !== parent || c.root !== root) continue;
      const n = Math.min(limit, c.tokens.length);
      let k = 0;
      while (k < n && c.tokens[k] === tokens[from + k]) k++;
      if (k > best.length) best = { block, length: k };
      if (k === limit) break;
    }
    return best;
  }

  #unlink(block: number, parentHash: number): void {
    const set = this.#byParent.get(parentHash);
    set?.delete(block);
    if (set?.size === 0) this.#byParent.delete(parentHash);
  }
}
