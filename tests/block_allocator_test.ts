import { assert, assertEquals, assertNotEquals, assertThrows } from "@std/assert";
import { BlockAllocator } from "../lib/core/block_allocator.ts";

function range(start: number, n: number): number[] {
  return Array.from({ length: n }, (_, i) => start + i);
}

function seqOf(seqId: number, tokens: number[]) {
  return { seqId, tokens };
}

Deno.test("BlockAllocator() rejects a non-positive block count", () => {
  const err = assertThrows(() => new BlockAllocator({ numBlocks: 0 }), RangeError);
  assert(err.message.includes("received 0"), err.message);
});

Deno.test("allocateSlots() grows a block table one block per blockSize tokens", () => {
  const kv = new BlockAllocator({ numBlocks: 8, blockSize: 4 });
  const s = seqOf(1, range(100, 10));
  assertEquals(kv.allocateSlots(s, 3)!.length, 1);
  assertEquals(kv.allocateSlots(s, 1)!.length, 1, "4 tokens still fit one block of 4");
  assertEquals(kv.allocateSlots(s, 1)!.length, 2);
  assertEquals(kv.allocateSlots(s, 5)!.length, 3, "10 tokens need ceil(10/4) = 3 blocks");
  const st = kv.stats();
  assertEquals([st.usedBlocks, st.freeBlocks], [3, 5]);
  assertEquals(new Set(kv.blockTable(1)).size, 3, "a table never names a block twice");
  kv.checkConsistency();
});

Deno.test("allocateSlots() returns null and changes nothing when the pool lacks room", () => {
  const kv = new BlockAllocator({ numBlocks: 3, blockSize: 4 });
  const a = seqOf(1, range(0, 8)), b = seqOf(2, range(50, 8));
  kv.allocateSlots(a, 8);
  assertEquals(kv.allocateSlots(b, 5), null, "5 tokens need 2 blocks, 1 is free");
  assertEquals(kv.blockTable(2), undefined);
  assertEquals(kv.stats().freeBlocks, 1);
  assertEquals(kv.allocateSlots(b, 4)!.length, 1);
  assertEquals(kv.allocateSlots(b, 1), null);
  assertEquals(kv.blockTable(2)!.length, 1);
  kv.checkConsistency();
});

Deno.test("allocateSlots() keeps `reserve` blocks free", () => {
  const kv = new BlockAllocator({ numBlocks: 4, blockSize: 4 });
  assertEquals(kv.allocateSlots(seqOf(1, range(0, 12)), 12, 2), null, "3 blocks + reserve 2 > 4");
  assertEquals(kv.allocateSlots(seqOf(1, range(0, 12)), 12, 1)!.length, 3);
});

Deno.test("free() returns blocks to the pool, and shared blocks only when the last owner frees", () => {
  const kv = new BlockAllocator({ numBlocks: 8, blockSize: 4 });
  const prompt = range(10, 9);
  const a = seqOf(1, prompt), b = seqOf(2, prompt);
  kv.allocateSlots(a, 9);
  kv.allocateSlots(a, 0); // publishes the two full blocks written by the first step
  assertEquals(kv.computedPrefix(b), 8);
  const tb = kv.allocateSlots(b, 1)!;
  assertEquals(tb.slice(0, 2), kv.blockTable(1)!.slice(0, 2), "b shares a's two full blocks");
  assertNotEquals(tb[2], kv.blockTable(1)![2], "the partial tail block is private");
  assertEquals(kv.stats().usedBlocks, 4);
  kv.free(a);
  assertEquals(kv.stats().usedBlocks, 3, "the shared blocks stay owned by b");
  kv.checkConsistency();
  kv.free(b);
  assertEquals(kv.stats().usedBlocks, 0);
  assertEquals(kv.numSeqs, 0);
  kv.checkConsistency();
});

Deno.test("computedPrefix() finds cached blocks to the token and always leaves one token to compute", () => {
  const kv = new BlockAllocator({ numBlocks: 16, blockSize: 4 });
  const shared = range(200, 12);
  const a = seqOf(1, [...shared, 7, 8]);
  kv.allocateSlots(a, 14);
  kv.free(a); // three full blocks published; the tail (2 tokens) is not full
  assertEquals(kv.computedPrefix(seqOf(2, [...shared, 9, 9, 9])), 12);
  assertEquals(
    kv.computedPrefix(seqOf(3, shared)),
    11,
    "12 cached tokens of 12 would leave nothing to compute: 2 blocks and 3 tokens of the third",
  );
  assertEquals(
    kv.computedPrefix(seqOf(4, [...shared.slice(0, 5), 0, ...shared.slice(6)])),
    5,
    "a difference at token 5 stops the match there: the first block and 1 token of the second",
  );
  assertEquals(kv.computedPrefix(seqOf(5, [1, ...shared])), 0, "a shifted prompt shares nothing");

  const c = seqOf(6, [...shared, 1, 2, 3]);
  assertEquals(kv.computedPrefix(c), 12);
  const table = kv.allocateSlots(c, 3)!;
  assertEquals(table.length, 4);
  assertEquals(kv.computedPrefix(c), 12, "an admitted sequence reports the prefix it took");
  const st = kv.stats();
  assertEquals([st.prefixQueryTokens, st.prefixHitTokens], [14 + 15, 12]);
  assertEquals(st.prefixHitRate, 12 / 29);
});

Deno.test("a block filled by a step is shared only from the sequence's next allocation on", () => {
  const kv = new BlockAllocator({ numBlocks: 8, blockSize: 4 });
  const prompt = range(0, 9);
  const a = seqOf(1, prompt);
  kv.allocateSlots(a, 9);
  assertEquals(
    kv.computedPrefix(seqOf(2, prompt)),
    0,
    "a's blocks are being written in the current step",
  );
  kv.allocateSlots(a, 1);
  assertEquals(kv.computedPrefix(seqOf(2, prompt)), 8);
});

Deno.test("a block is published only once its tokens are known", () => {
  const kv = new BlockAllocator({ numBlocks: 8, blockSize: 4 });
  const tokens = range(0, 3);
  const a = seqOf(1, tokens);
  kv.allocateSlots(a, 3);
  kv.allocateSlots(a, 1); // slot 3 holds a token sampled on the device, unknown here
  kv.allocateSlots(a, 1);
  assertEquals(
    kv.computedPrefix(seqOf(2, [0, 1, 2, 3, 4, 5])),
    3,
    "the 3 known tokens are shared, not the 2 sampled on the device",
  );
  tokens.push(3, 4);
  kv.allocateSlots(a, 0);
  assertEquals(kv.computedPrefix(seqOf(2, [0, 1, 2, 3, 4, 5])), 5);
});

Deno.test("prefix matches are confirmed by token ids and parent block, not the hash alone", () => {
  // A weak hash (token sum, parent ignored) collides often: only the confirmation tells blocks apart.
  const sum = (_parent: number, t: readonly number[], from: number, to: number) => {
    let h = 0;
    for (let i = from; i < to; i++) h += t[i]!;
    return h;
  };
  const kv = new BlockAllocator({ numBlocks: 16, blockSize: 4, hash: sum });
  const a = seqOf(1, [1, 1, 1, 1, 2, 2, 2, 2, 0]);
  kv.allocateSlots(a, 9);
  kv.free(a);
  assertEquals(
    kv.computedPrefix(seqOf(2, [1, 1, 1, 1, 2, 2, 2, 2, 5])),
    8,
    "the true prefix matches",
  );
  assertEquals(kv.computedPrefix(seqOf(3, [3, 1, 0, 0, 9])), 0, "same hash, different tokens");
  assertEquals(
    kv.computedPrefix(seqOf(4, [1, 1, 1, 1, 4, 4, 0, 0, 9])),
    4,
    "second block collides, tokens differ",
  );
  // [2,2,2,2] is cached as the child of [1,1,1,1]; as a first block its KV would be wrong.
  assertEquals(kv.computedPrefix(seqOf(5, [2, 2, 2, 2, 0])), 0, "same tokens, different parent");
});

Deno.test("freed cached blocks are evicted least recently freed first, tail before head", () => {
  const kv = new BlockAllocator({ numBlocks: 4, blockSize: 4 });
  const a = seqOf(1, range(0, 9)), b = seqOf(2, range(100, 9));
  kv.allocateSlots(a, 8);
  kv.free(a);
  kv.allocateSlots(b, 8);
  kv.free(b);
  assertEquals(kv.stats().cachedFreeBlocks, 4);
  assertEquals(kv.stats().freeBlocks, 4, "cached free blocks still count as free");
  const c = seqOf(3, range(500, 4));
  kv.allocateSlots(c, 4);
  assertEquals(kv.stats().evictions, 1);
  assertEquals(kv.computedPrefix(a), 4, "a's tail block went first, its head survives");
  assertEquals(kv.computedPrefix(b), 8);
  kv.allocateSlots(c, 4);
  assertEquals(kv.computedPrefix(a), 0);
  assertEquals(kv.computedPrefix(b), 8);
  kv.free(c);
  kv.checkConsistency();
});

Deno.test("taking a cached prefix protects it from eviction by the same call", () => {
  const kv = new BlockAllocator({ numBlocks: 3, blockSize: 4 });
  const a = seqOf(1, range(0, 9));
  kv.allocateSlots(a, 8);
  kv.free(a); // 2 cached free blocks, 1 uncached
  const b = seqOf(2, [...range(0, 8), 77]);
  assertEquals(kv.computedPrefix(b), 8);
  assertEquals(
    kv.allocateSlots(b, 5),
    null,
    "needs 2 new blocks; only 1 is free besides its prefix",
  );
  const t = kv.allocateSlots(b, 1)!;
  assertEquals(t.length, 3);
  assertEquals(kv.stats().evictions, 0);
  kv.checkConsistency();
});

Deno.test("reset() forgets sequences and cached blocks", () => {
  const kv = new BlockAllocator({ numBlocks: 4, blockSize: 4 });
  const a = seqOf(1, range(0, 9));
  kv.allocateSlots(a, 9);
  kv.allocateSlots(a, 0);
  kv.reset();
  assertEquals(kv.stats().freeBlocks, 4);
  assertEquals(kv.computedPrefix(seqOf(2, range(0, 9))), 0);
  kv.checkConsistency();
});

Deno.test("random allocate/free/lookup sequences keep the books consistent and shared blocks intact", () => {
  let state = 12345;
  const rand = (n: number) => {
    state = (Math.imul(state, 1103515245) + 12345) >>> 0;
    return (state >>> 8) % n;
  };
  const kv = new BlockAllocator({ numBlocks: 24, blockSize: 4 });
  // An independent model of block contents: what each owner wrote at each position.
  const content = new Map<number, number[]>();
  const live = new Map<number, { seqId: number; tokens: number[]; written: number }>();
  let nextId = 1, copies = 0;
  for (let op = 0; op < 4000; op++) {
    const r = rand(10);
    if (r < 4 || live.size === 0) {
      const base = rand(3) * 1000; // few distinct prefixes, so the cache gets hits
      // Shared prefixes of any length, so partial blocks are shared too.
      const tokens = [...range(base, rand(16)), ...range(rand(1e6), 1 + rand(9))];
      const s = { seqId: nextId++, tokens, written: 0 };
      const cached = kv.computedPrefix(s);
      const table = kv.allocateSlots(s, tokens.length - cached);
      // What the engine does first: copy-on-write of the partly shared blocks.
      for (const [src, dst] of kv.takeCopies()) {
        content.set(dst, [...content.get(src) ?? []]);
        copies++;
      }
      if (!table) continue;
      // Cached blocks must hold exactly the tokens this sequence would have written.
      for (let pos = 0; pos < cached; pos++) {
        const b = table[Math.floor(pos / 4)]!;
        assertEquals(
          content.get(b)?.[pos % 4],
          tokens[pos],
          `cached block ${b} holds foreign content`,
        );
      }
      for (let pos = cached; pos < tokens.length; pos++) {
        const b = table[Math.floor(pos / 4)]!;
        const c = content.get(b) ?? [];
        c[pos % 4] = tokens[pos]!;
        content.set(b, c);
      }
      s.written = tokens.length;
      live.set(s.seqId, s);
    } else if (r < 7) {
      const ids = [...live.keys()];
      const s = live.get(ids[rand(ids.length)]!)!;
      const tok = rand(1e6);
      s.tokens.push(tok);
      const table = kv.allocateSlots(s, 1);
      if (!table) continue;
      const b = table[Math.floor(s.written / 4)]!;
      const c = content.get(b) ?? [];
      c[s.written % 4] = tok;
      content.set(b, c);
      s.written++;
    } else {
      const ids = [...live.keys()];
      const id = ids[rand(ids.length)]!;
      kv.free(live.get(id)!);
      live.delete(id);
    }
    kv.checkConsistency();
  }
  for (const s of live.values()) kv.free(s);
  assertEquals(kv.stats().usedBlocks, 0);
  assert(kv.stats().prefixHitTokens > 0, "the random workload should have hit the cache");
  assert(copies > 0, "the random workload should have shared partial blocks");
  assert(kv.stats().evictions > 0, "the random workload should have evicted");
});

Deno.test("a prompt sharing 20 of 21 tokens of a cached one takes 20 and copies the partial block", () => {
  const kv = new BlockAllocator({ numBlocks: 8, blockSize: 16 });
  const a = seqOf(1, range(100, 21));
  kv.allocateSlots(a, 21);
  const aTable = [...kv.blockTable(1)!];
  kv.free(a); // block 0 cached whole, block 1 holds a's tail of 5 tokens
  const b = seqOf(2, [...range(100, 20), 7]);
  assertEquals(kv.computedPrefix(b), 20, "16 of a whole block and 4 of the tail");
  const table = kv.allocateSlots(b, 1)!;
  assertEquals(table[0], aTable[0], "the whole block is shared");
  assertNotEquals(table[1], aTable[1], "the partial block is b's own copy");
  assertEquals(kv.takeCopies(), [[aTable[1], table[1]]]);
  assertEquals(kv.takeCopies(), [], "each copy is handed over once");
  assertEquals(kv.stats().prefixHitTokens, 20);
  kv.checkConsistency();
});

Deno.test("a running sequence's tail is shared from its next allocation on, up to its known tokens", () => {
  const kv = new BlockAllocator({ numBlocks: 8, blockSize: 16 });
  const tokens = range(0, 6);
  const a = seqOf(1, tokens);
  kv.allocateSlots(a, 6);
  const probe = seqOf(2, [...range(0, 6), 99]);
  assertEquals(kv.computedPrefix(probe), 0, "a's tail is being written in the current step");
  kv.allocateSlots(a, 1); // the next step: slots 0..5 are written; slot 6's token is unknown
  assertEquals(kv.computedPrefix(probe), 6);
  const t = kv.allocateSlots(probe, 1)!;
  assertEquals(kv.takeCopies(), [[kv.blockTable(1)![0], t[0]]]);
  kv.checkConsistency();
});

Deno.test("a shared partial block that is evicted is no longer found; a copy planned before stands", () => {
  const kv = new BlockAllocator({ numBlocks: 3, blockSize: 4 });
  const a = seqOf(1, range(0, 6));
  kv.allocateSlots(a, 6);
  const aTable = [...kv.blockTable(1)!];
  kv.free(a); // [0..4) cached whole, the tail [4, 5] partial
  const b = seqOf(2, [0, 1, 2, 3, 4, 77]);
  assertEquals(kv.computedPrefix(b), 5);
  const tb = kv.allocateSlots(b, 1)!;
  assertEquals(tb.length, 2);
  // c needs 1 block; the only free one besides b's is a's tail, the least recently freed.
  const c = seqOf(3, range(500, 3));
  const tc = kv.allocateSlots(c, 3)!;
  assertEquals(tc, [aTable[1]], "a's tail is evicted and reused in the same step");
  assertEquals(kv.stats().evictions, 1);
  assertEquals(
    kv.takeCopies(),
    [[aTable[1], tb[1]]],
    "b's copy comes first in the step, so it reads a's tail before c overwrites it",
  );
  kv.free(b);
  kv.free(c);
  assertEquals(
    kv.computedPrefix(seqOf(4, [0, 1, 2, 3, 4, 5, 6])),
    5,
    "a's tail is gone; b's copy (0..4 then 77) still gives token 4",
  );
  kv.checkConsistency();
});

Deno.test("a preempted sequence that shared a partial block finds its own copy again", () => {
  const kv = new BlockAllocator({ numBlocks: 8, blockSize: 4 });
  const a = seqOf(1, range(0, 6));
  kv.allocateSlots(a, 6);
  kv.allocateSlots(a, 0); // the next step: a's tail [4, 5] is published
  const b = seqOf(2, [0, 1, 2, 3, 4, 50, 51]);
  assertEquals(kv.computedPrefix(b), 5);
  const tb = [...kv.allocateSlots(b, 2)!];
  kv.takeCopies();
  b.tokens.push(52); // b sampled one more token
  kv.free(b); // preempted: its blocks go back, its tail (4, 50, 51) cached
  assertEquals(
    kv.computedPrefix(b),
    7,
    "recomputing b takes back its 7 written tokens: block 0 and 3 tokens of its own tail",
  );
  const again = kv.allocateSlots(b, 1)!;
  assertEquals(again[0], tb[0]);
  const copies = kv.takeCopies();
  assertEquals(copies.length, again[1] === tb[1] ? 0 : 1, "taken back in place, or copied");
  if (copies.length) assertEquals(copies[0], [tb[1], again[1]]);
  kv.free(a);
  kv.free(b);
  kv.checkConsistency();
});
