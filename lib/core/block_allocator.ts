import { DEFAULT_LIMITS } from "../engine/limits.ts";
import type { KvCopy } from "../engine/engine.ts";
import { hash32 } from "../util/rng.ts";
import { BlockChildren, NO_PARENT } from "./block_children.ts";

/** What the allocator reads of a sequence: its id and the token ids known so far. */
export interface KvSeq {
  readonly seqId: number;
  /** Prompt, then generated tokens the CPU has seen (may run ahead of the scheduled slots). */
  readonly tokens: readonly number[];
  /**
   * Root of its blocks' hash chain ({@link cacheScopeRoot}): sequences share cached blocks
   * only within one root, so one API key's prompts are never another's cache hits.
   */
  readonly cacheRoot?: number;
  /** Its blocks are neither taken from the prefix cache nor published to it (embeddings). */
  readonly uncached?: boolean;
}

export interface BlockAllocatorOptions {
  readonly numBlocks: number;
  /** Tokens per block; 16 by default. */
  readonly blockSize?: number;
  /** Share full blocks between sequences with the same prefix; on by default. */
  readonly prefixCaching?: boolean;
  /** Chained block hash (parent hash, tokens[from, to)); replaceable so tests can force collisions. */
  readonly hash?: (parent: number, tokens: readonly number[], from: number, to: number) => number;
}

/** Counters for metrics. Token counts refer to prefix-cache lookups at admission. */
export interface BlockAllocatorStats {
  readonly numBlocks: number;
  readonly blockSize: number;
  /** Blocks owned by at least one sequence. */
  readonly usedBlocks: number;
  /** Blocks owned by none (including cached ones that can still be reused). */
  readonly freeBlocks: number;
  /** Free blocks that still hold a reusable cached prefix. */
  readonly cachedFreeBlocks: number;
  readonly prefixQueryTokens: number;
  readonly prefixHitTokens: number;
  /** prefixHitTokens / prefixQueryTokens, 0 before any lookup. */
  readonly prefixHitRate: number;
  /** Cached blocks dropped to make room. */
  readonly evictions: number;
}

interface SeqBlocks {
  readonly blocks: number[];
  /** Slots [0, numTokens) are reserved (written by scheduled steps). */
  numTokens: number;
  /** Leading full blocks already published in (or taken from) the prefix cache. */
  numHashed: number;
  /** Its chain's root ({@link KvSeq.cacheRoot}). */
  readonly root: number;
  /** Chained hash of the last hashed block. */
  lastHash: number;
  /** Tokens whose KV came from the prefix cache at the first allocation. */
  cachedTokens: number;
}

/** Identity of a cached block: confirmed by parent block and token ids, not by hash alone. */
interface CachedBlock {
  readonly hash: number;
  /** The chained hash before it (its root for a first block). */
  readonly parentHash: number;
  readonly parent: number;
  /** The chain's root: a first block is confirmed by it too, not by its hash alone. */
  readonly root: number;
  readonly tokens: Int32Array;
}

const ROOT_HASH = 0x6a09e667;

/**
 * What a lookup found: whole cached blocks, then `extra` leading slots of `donor`, a cached or
 * partly filled block that the new sequence gets a copy of (-1 and 0 when none).
 */
interface Prefix {
  readonly blocks: number[];
  readonly donor: number;
  readonly extra: number;
}

/**
 * The hash-chain root of a cache scope (an API key's, or "" for the shared one): blocks are
 * named by chains from their scope's root, so a prompt under one scope never finds another's
 * cached blocks, and `cached_tokens` cannot confirm another tenant's prompt block by block.
 */
export function cacheScopeRoot(scope: string | undefined): number {
  if (scope === undefined || scope === "") return ROOT_HASH;
  let h = ROOT_HASH ^ 0x5be0cd19;
  for (let i = 0; i < scope.length; i++) h = hash32(h ^ scope.charCodeAt(i), i);
  // Never the shared root, whatever the scope.
  return h === ROOT_HASH ? h ^ 1 : h;
}

/**
 * The chained hashes of a token sequence's full blocks, as the prefix cache names them: entry i
 * identifies blocks 0..i. A router compares them with a replica's {@link
 * BlockAllocator.cachedBlockHashes} to guess how much of a prompt that replica has cached.
 * Like a lookup, the last token is never counted (one token is always computed).
 */
export function prefixBlockHashes(
  tokens: readonly number[],
  blockSize: number,
  root = ROOT_HASH,
): number[] {
  const out: number[] = [];
  let h = root;
  const n = Math.floor((tokens.length - 1) / blockSize);
  for (let i = 0; i < n; i++) {
    h = blockHash(h, tokens, i * blockSize, (i + 1) * blockSize);
    out.push(h);
  }
  return out;
}

/** Chained hash of one full block: (parent hash, its token ids). */
function blockHash(parent: number, tokens: readonly number[], from: number, to: number): number {
  let h = parent;
  for (let i = from; i < to; i++) h = hash32(h ^ (tokens[i]! | 0), i - from);
  return h;
}

/**
 * The KV block pool: free list, reference counts and prefix caching. The scheduler sees only
 * {@link allocateSlots}, {@link free} and {@link computedPrefix}; which physical blocks a
 * sequence owns is decided here and nowhere else.
 *
 * A full block is published in the prefix cache one step after the step that writes it was
 * planned (at the sequence's next allocateSlots, or at free), so no sequence ever reads a block
 * in the same step that fills it. Free blocks that hold a cached prefix stay reusable until
 * evicted, least recently freed first.
 *
 * Reuse goes to the token: past its last whole cached block, a prompt also takes the leading
 * tokens it shares with the block that follows that prefix in the cache, full or a sequence's
 * partly filled tail (compared by token ids, {@link BlockChildren}). Those blocks are shared
 * copy-on-write: the new sequence gets a fresh block and a copy of the shared one
 * ({@link takeCopies}, which the step plan carries to the engine), since its next token is
 * written into that block. Copies run before the step computes anything, and a tail counts only
 * the tokens of steps planned before, so a copy always reads KV already written.
 *
 * @example
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const kv = new BlockAllocator({ numBlocks: 64 });
 * const seq = { seqId: 1, tokens: [1, 2, 3] };
 * const cached = kv.computedPrefix(seq);
 * assertEquals(cached, 0); // nothing cached yet
 * const table = kv.allocateSlots(seq, 3 - cached); // null when the free blocks do not suffice
 * assertEquals(table?.length, 1); // three tokens fit one block
 * kv.free(seq);
 * ```
 */
export class BlockAllocator {
  readonly numBlocks: number;
  readonly blockSize: number;
  readonly prefixCaching: boolean;
  #refCount: Int32Array;
  /** Free blocks without cached content; taken first. */
  #freeUncached: number[] = [];
  /** Free blocks with cached content, in LRU order (Map keeps insertion order). */
  #freeCached = new Map<number, true>();
  #cachedByHash = new Map<number, number>();
  #cached: (CachedBlock | undefined)[];
  /** Full cached blocks and partly filled tails, by the prefix they follow. */
  #children = new BlockChildren();
  /** Block copies for the step being planned. */
  #copies: KvCopy[] = [];
  #seqs = new Map<number, SeqBlocks>();
  #queryTokens = 0;
  #hitTokens = 0;
  #evictions = 0;
  #hash: (parent: number, tokens: readonly number[], from: number, to: number) => number;

  constructor(options: BlockAllocatorOptions) {
    const {
      numBlocks,
      blockSize = DEFAULT_LIMITS.blockSize,
      prefixCaching = true,
      hash = blockHash,
    } = options;
    this.#hash = hash;
    if (!Number.isInteger(numBlocks) || numBlocks < 1) {
      throw new RangeError(
        `Cannot create block allocator: numBlocks must be a positive integer, received ${numBlocks}`,
      );
    }
    if (!Number.isInteger(blockSize) || blockSize < 1) {
      throw new RangeError(
        `Cannot create block allocator: blockSize must be a positive integer, received ${blockSize}`,
      );
    }
    this.numBlocks = numBlocks;
    this.blockSize = blockSize;
    this.prefixCaching = prefixCaching;
    this.#refCount = new Int32Array(numBlocks);
    this.#cached = new Array(numBlocks).fill(undefined);
    this.reset();
  }

  /** Forgets every sequence and every cached block (the device's KV contents are gone). */
  reset(): void {
    this.#refCount.fill(0);
    this.#cached.fill(undefined);
    this.#cachedByHash.clear();
    this.#children.clear();
    this.#copies = [];
    this.#freeCached.clear();
    this.#seqs.clear();
    // Popped from the end: block 0 is handed out first, which keeps tests readable.
    this.#freeUncached = Array.from({ length: this.numBlocks }, (_, i) => this.numBlocks - 1 - i);
  }

  /** Blocks that can be handed out now (free, including evictable cached ones). */
  get numFreeBlocks(): number {
    return this.#freeUncached.length + this.#freeCached.size;
  }

  /** Blocks needed to hold `numTokens` tokens. */
  blocksFor(numTokens: number): number {
    return Math.ceil(numTokens / this.blockSize);
  }

  /**
   * Number of the sequence's leading tokens whose KV is already in the pool. For a sequence
   * that owns no blocks yet this is a prefix-cache lookup: whole cached blocks, then the tokens
   * it shares with the block after them (any number), always leaving at least one token to
   * compute (the step must produce logits). For a sequence that owns blocks it is the prefix it
   * got from the cache when it was admitted.
   */
  computedPrefix(seq: KvSeq): number {
    const own = this.#seqs.get(seq.seqId);
    if (own) return own.cachedTokens;
    const p = this.#lookup(seq);
    return p.blocks.length * this.blockSize + p.extra;
  }

  /**
   * The block copies that admissions since the last call need ([source, destination]), for the
   * step being planned (StepPlan.kvCopies): a destination's shared slots must be copied before
   * that step writes the rest.
   */
  takeCopies(): KvCopy[] {
    return this.#copies.splice(0);
  }

  /**
   * Makes the sequence's blocks cover `numNewTokens` more slots and returns its block table,
   * or null (changing nothing) when the pool has no room. A sequence's first call takes the
   * cached prefix that computedPrefix() reported in the same synchronous turn, and the new
   * slots follow it. `reserve` blocks must stay free after the call (admission headroom).
   * The returned table is the allocator's own array: copy it to keep it past the next call.
   */
  allocateSlots(seq: KvSeq, numNewTokens: number, reserve = 0): readonly number[] | null {
    if (!Number.isInteger(numNewTokens) || numNewTokens < 0) {
      throw new RangeError(
        `Cannot allocate slots for seq ${seq.seqId}: numNewTokens must be a non-negative integer, received ${numNewTokens}`,
      );
    }
    let own = this.#seqs.get(seq.seqId);
    if (own) {
      // Blocks filled by earlier steps are safe to share from now on.
      this.#publish(own, seq);
      const need = this.blocksFor(own.numTokens + numNewTokens) - own.blocks.length;
      if (need > 0 && need > this.numFreeBlocks - reserve) return null;
      for (let i = 0; i < need; i++) own.blocks.push(this.#take());
      own.numTokens += numNewTokens;
      return own.blocks;
    }
    const { blocks: prefix, donor, extra } = this.#lookup(seq);
    const cachedTokens = prefix.length * this.blockSize + extra;
    // The copy of a partly shared block is one of the new blocks.
    const need = this.blocksFor(cachedTokens + numNewTokens) - prefix.length;
    // Prefix blocks taken from the free pool are no longer available for new slots.
    let claimedFromFree = 0;
    for (const b of prefix) if (this.#refCount[b] === 0) claimedFromFree++;
    if (need > this.numFreeBlocks - claimedFromFree - reserve) return null;
    own = {
      blocks: [],
      numTokens: 0,
      numHashed: 0,
      root: seq.cacheRoot ?? ROOT_HASH,
      lastHash: seq.cacheRoot ?? ROOT_HASH,
      cachedTokens: 0,
    };
    this.#seqs.set(seq.seqId, own);
    for (const b of prefix) {
      this.#retain(b);
      own.blocks.push(b);
      own.lastHash = this.#cached[b]!.hash;
    }
    own.numHashed = prefix.length;
    own.numTokens = own.cachedTokens = cachedTokens;
    this.#queryTokens += seq.tokens.length;
    this.#hitTokens += own.cachedTokens;
    // The donor is not held: a later take may evict it and the step write over it, but the
    // step's copies run before it writes anything. Taken as the copy itself, it needs none.
    for (let i = 0; i < need; i++) own.blocks.push(this.#take());
    const copy = own.blocks[prefix.length];
    if (extra > 0 && copy !== donor) this.#copies.push([donor, copy!]);
    own.numTokens += numNewTokens;
    return own.blocks;
  }

  /**
   * Hashes of the blocks in the prefix cache (see {@link prefixBlockHashes}), the most recently
   * published last, at most `limit` of them: a summary a replica can report to a router.
   */
  cachedBlockHashes(limit: number): number[] {
    const all = [...this.#cachedByHash.keys()];
    return all.length <= limit ? all : all.slice(all.length - limit);
  }

  /** Releases the sequence's blocks; its full blocks stay cached for reuse until evicted. */
  free(seq: KvSeq): void {
    const own = this.#seqs.get(seq.seqId);
    if (!own) return;
    this.#publish(own, seq);
    this.#seqs.delete(seq.seqId);
    // Tail first, so the tail is evicted before the more shareable head.
    for (let i = own.blocks.length - 1; i >= 0; i--) this.#release(own.blocks[i]!);
  }

  /** The sequence's block table, or undefined if it owns none. */
  blockTable(seqId: number): readonly number[] | undefined {
    return this.#seqs.get(seqId)?.blocks;
  }

  /** Number of sequences holding blocks. */
  get numSeqs(): number {
    return this.#seqs.size;
  }

  stats(): BlockAllocatorStats {
    const freeBlocks = this.numFreeBlocks;
    return {
      numBlocks: this.numBlocks,
      blockSize: this.blockSize,
      usedBlocks: this.numBlocks - freeBlocks,
      freeBlocks,
      cachedFreeBlocks: this.#freeCached.size,
      prefixQueryTokens: this.#queryTokens,
      prefixHitTokens: this.#hitTokens,
      prefixHitRate: this.#queryTokens === 0 ? 0 : this.#hitTokens / this.#queryTokens,
      evictions: this.#evictions,
    };
  }

  /**
   * Throws if the internal books disagree: every block is either owned (ref count equal to the
   * number of tables naming it) or in exactly one free list. For tests.
   */
  checkConsistency(): void {
    const refs = new Int32Array(this.numBlocks);
    for (const own of this.#seqs.values()) for (const b of own.blocks) refs[b]!++;
    const inFree = new Int32Array(this.numBlocks);
    for (const b of this.#freeUncached) inFree[b]!++;
    for (const b of this.#freeCached.keys()) inFree[b]!++;
    for (let b = 0; b < this.numBlocks; b++) {
      if (refs[b] !== this.#refCount[b]) {
        throw new Error(
          `Block ${b}: ref count ${this.#refCount[b]} but ${refs[b]} block tables name it`,
        );
      }
      const expectFree = refs[b] === 0 ? 1 : 0;
      if (inFree[b] !== expectFree) {
        throw new Error(`Block ${b}: ref count ${refs[b]} but listed ${inFree[b]} times as free`);
      }
      if (this.#freeCached.has(b) && !this.#hasContent(b)) {
        throw new Error(`Block ${b}: in the cached free list without cached content`);
      }
    }
    for (const [h, b] of this.#cachedByHash) {
      if (this.#cached[b]?.hash !== h) {
        throw new Error(`Hash ${h} maps to block ${b}, which holds hash ${this.#cached[b]?.hash}`);
      }
    }
  }

  /**
   * Cached blocks matching the sequence's leading full blocks, then the block sharing most of
   * its next tokens, leaving at least one token to compute.
   */
  #lookup(seq: KvSeq): Prefix {
    const found: number[] = [];
    if (!this.prefixCaching || seq.uncached) return { blocks: found, donor: -1, extra: 0 };
    const maxBlocks = Math.floor((seq.tokens.length - 1) / this.blockSize);
    const root = seq.cacheRoot ?? ROOT_HASH;
    let parentHash = root;
    let parentBlock = NO_PARENT;
    for (let i = 0; i < maxBlocks; i++) {
      const from = i * this.blockSize, to = from + this.blockSize;
      const h = this.#hash(parentHash, seq.tokens, from, to);
      const b = this.#cachedByHash.get(h);
      if (b === undefined) break;
      const c = this.#cached[b]!;
      if (c.parent !== parentBlock || c.root !== root || !sameTokens(c.tokens, seq.tokens, from)) {
        break;
      }
      found.push(b);
      parentHash = h;
      parentBlock = b;
    }
    const from = found.length * this.blockSize;
    const limit = Math.min(this.blockSize, seq.tokens.length - 1 - from);
    const m = limit > 0
      ? this.#children.longestMatch(parentHash, parentBlock, root, seq.tokens, from, limit)
      : undefined;
    return { blocks: found, donor: m?.block ?? -1, extra: m?.length ?? 0 };
  }

  /**
   * Publishes the sequence's full blocks whose slots were scheduled and whose tokens are known,
   * and records how much of its tail block they fill.
   */
  #publish(own: SeqBlocks, seq: KvSeq): void {
    if (!this.prefixCaching || seq.uncached) return;
    const written = Math.min(own.numTokens, seq.tokens.length);
    const full = Math.floor(written / this.blockSize);
    while (own.numHashed < full) {
      const i = own.numHashed;
      const from = i * this.blockSize, to = from + this.blockSize;
      const h = this.#hash(own.lastHash, seq.tokens, from, to);
      const b = own.blocks[i]!;
      if (!this.#cached[b]) this.#children.delete(b); // no longer a tail
      // An equal block already cached elsewhere keeps its entry; this copy stays private.
      if (!this.#cachedByHash.has(h) && !this.#cached[b]) {
        const c: CachedBlock = {
          hash: h,
          parentHash: own.lastHash,
          parent: i === 0 ? NO_PARENT : own.blocks[i - 1]!,
          root: own.root,
          tokens: Int32Array.from(seq.tokens.slice(from, to)),
        };
        this.#cached[b] = c;
        this.#cachedByHash.set(h, b);
        this.#children.set(b, c);
      }
      own.lastHash = h;
      own.numHashed++;
    }
    const from = full * this.blockSize;
    if (written > from) {
      this.#children.set(own.blocks[full]!, {
        parentHash: own.lastHash,
        parent: full === 0 ? NO_PARENT : own.blocks[full - 1]!,
        root: own.root,
        tokens: seq.tokens.slice(from, written),
      });
    }
  }

  /** Whether a free block still holds something a lookup can reuse. */
  #hasContent(b: number): boolean {
    return this.#cached[b] !== undefined || this.#children.has(b);
  }

  #retain(b: number): void {
    if (this.#refCount[b] === 0) this.#freeCached.delete(b);
    this.#refCount[b]!++;
  }

  #release(b: number): void {
    if (--this.#refCount[b]! > 0) return;
    if (this.#hasContent(b)) this.#freeCached.set(b, true);
    else this.#freeUncached.push(b);
  }

  /** A free block for new slots: an uncached one, else the least recently freed cached one. */
  #take(): number {
    let b = this.#freeUncached.pop();
    if (b === undefined) {
      const lru = this.#freeCached.keys().next();
      if (lru.done) {
        throw new Error("BlockAllocator: no free block although the count said there was one");
      }
      b = lru.value;
      this.#freeCached.delete(b);
      const c = this.#cached[b];
      if (c && this.#cachedByHash.get(c.hash) === b) this.#cachedByHash.delete(c.hash);
      this.#cached[b] = undefined;
      this.#children.delete(b);
      this.#evictions++;
    }
    this.#refCount[b] = 1;
    return b;
  }
}

function sameTokens(cached: Int32Array, tokens: readonly number[], from: number): boolean {
  for (let i = 0; i < cached.length; i++) if (cached[i] !== tokens[from + i]) return false;
  return true;
}
