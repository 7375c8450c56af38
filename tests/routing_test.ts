import { assertEquals } from "@std/assert";
import { type Candidate, chooseReplica, matchedBlocks } from "../lib/cluster/routing.ts";
import { BlockAllocator, prefixBlockHashes } from "../lib/core/block_allocator.ts";

function cand(id: string, over: Partial<Candidate> = {}): Candidate {
  return {
    id,
    load: 0,
    capacity: 10,
    routed: 0,
    recent: 0,
    matchedBlocks: 0,
    cachedBlocks: 0,
    ...over,
  };
}

Deno.test("no replica gives 'none'; every replica at its limit gives 'overloaded'", () => {
  assertEquals(chooseReplica([], { policy: "prefix" }).kind, "none");
  const full = [cand("a", { load: 10 }), cand("b", { load: 12 })];
  assertEquals(chooseReplica(full, { policy: "prefix" }).kind, "overloaded");
  assertEquals(chooseReplica(full, { policy: "round-robin" }).kind, "overloaded");
});

Deno.test("least-loaded takes the fewest running + waiting, ties to less recent work, then id", () => {
  const pick = (cs: Candidate[]) => {
    const c = chooseReplica(cs, { policy: "least-loaded" });
    return c.kind === "replica" ? c.id : c.kind;
  };
  assertEquals(pick([cand("a", { load: 3 }), cand("b", { load: 1 }), cand("c", { load: 2 })]), "b");
  assertEquals(pick([cand("a", { load: 1, recent: 5 }), cand("b", { load: 1, recent: 2 })]), "b");
  assertEquals(pick([cand("b", { load: 1 }), cand("a", { load: 1 })]), "a");
  // A full replica is skipped even when its prefix matches.
  assertEquals(pick([cand("a", { load: 10 }), cand("b", { load: 9 })]), "b");
});

Deno.test("prefix routing: the longest cached prefix wins unless its holder is much busier", () => {
  const pick = (cs: Candidate[]) => {
    const c = chooseReplica(cs, { policy: "prefix" });
    return c.kind === "replica" ? `${c.id}:${c.reason}` : c.kind;
  };
  const base = [cand("a", { load: 2 }), cand("b", { load: 0 }), cand("c", { load: 1 })];
  assertEquals(pick(base), "b:least_loaded");
  // c holds 5 blocks, a holds 3: c, though b is idle (1 request ahead is within max(8, 50%)).
  const held = [
    cand("a", { load: 2, matchedBlocks: 3 }),
    cand("b", { load: 0 }),
    cand("c", { load: 1, matchedBlocks: 5 }),
  ];
  assertEquals(pick(held), "c:prefix");
  // 9 requests ahead of the least loaded (slack max(8, 0.5 x 0) = 8): passed over.
  assertEquals(
    pick([cand("a", { load: 9, matchedBlocks: 5 }), cand("b", { load: 0 })]),
    "b:least_loaded",
  );
  // The slack grows with load: max(8, 0.5 x 20) = 10 requests ahead are allowed, 11 are not.
  const big = { capacity: 100 };
  assertEquals(
    pick([cand("a", { ...big, load: 30, matchedBlocks: 1 }), cand("b", { ...big, load: 20 })]),
    "a:prefix",
  );
  assertEquals(
    pick([cand("a", { ...big, load: 31, matchedBlocks: 1 }), cand("b", { ...big, load: 20 })]),
    "b:least_loaded",
  );
  // Recent work 15 > 1.25 x 10 + 2 = 14.5: the holder is passed over so the prefix spreads.
  assertEquals(
    pick([cand("a", { recent: 15, matchedBlocks: 4 }), cand("b", { recent: 10 })]),
    "b:least_loaded",
  );
  assertEquals(
    pick([cand("a", { recent: 14, matchedBlocks: 4 }), cand("b", { recent: 10 })]),
    "a:prefix",
  );
  // A new prefix among equally loaded replicas goes to the smallest cache.
  assertEquals(
    pick([cand("a", { cachedBlocks: 30 }), cand("b", { cachedBlocks: 10 })]),
    "b:least_loaded",
  );
});

Deno.test("round-robin cycles through open replicas in id order", () => {
  const cs = [cand("b"), cand("a"), cand("c")];
  const ids = [0, 1, 2, 3].map((turn) => {
    const c = chooseReplica(cs, { policy: "round-robin", turn });
    return c.kind === "replica" ? c.id : c.kind;
  });
  assertEquals(ids, ["a", "b", "c", "a"]);
});

Deno.test("a prompt's block hashes match what the allocator's prefix cache holds after it", () => {
  const kv = new BlockAllocator({ numBlocks: 16, blockSize: 4 });
  const tokens = Array.from({ length: 14 }, (_, i) => 100 + i);
  const seq = { seqId: 1, tokens };
  kv.allocateSlots(seq, tokens.length);
  kv.free(seq);
  const cached = new Set(kv.cachedBlockHashes(100));
  const hashes = prefixBlockHashes(tokens, 4);
  // 14 tokens: 3 full blocks, all published at free; a lookup leaves the last token to compute.
  assertEquals(hashes.length, 3);
  assertEquals(matchedBlocks(hashes, cached), 3);
  // The cache reuses to the token (3 blocks and 1 token of the tail): the router's whole
  // blocks are a lower bound of it, off by less than a block.
  const probe = { seqId: 2, tokens };
  assertEquals(kv.computedPrefix(probe), 3 * 4 + 1);
  // A prompt that diverges in block 2 matches blocks 0 and 1 only; the cache also reuses the
  // 1 token of block 2 before the difference.
  const other = [...tokens.slice(0, 9), 7, 7, 7, 7, 7];
  assertEquals(matchedBlocks(prefixBlockHashes(other, 4), cached), 2);
  assertEquals(kv.computedPrefix({ seqId: 3, tokens: other }), 2 * 4 + 1);
  // Only the leading run counts: a hole at block 0 means nothing is reused.
  assertEquals(matchedBlocks([1, ...hashes.slice(1)], cached), 0);
});

Deno.test("replicas with the model loaded are preferred while one has room, whatever the policy", () => {
  for (const policy of ["prefix", "least-loaded", "round-robin"] as const) {
    const pick = (cs: Candidate[], turn = 0) => {
      const c = chooseReplica(cs, { policy, turn });
      return c.kind === "replica" ? c.id : c.kind;
    };
    // The cold one is idle and holds the prompt's prefix; the warm one is busier.
    const cold = cand("a", { loaded: false, load: 0, matchedBlocks: 4 });
    assertEquals(pick([cold, cand("b", { loaded: true, load: 5 })]), "b", policy);
    assertEquals(pick([cold, cand("b", { loaded: true, load: 5 })], 1), "b", policy);
    // The warm one full: the cold one loads it.
    assertEquals(pick([cold, cand("b", { loaded: true, load: 10 })]), "a", policy);
    // None has it: the least loaded of those that would load it (round-robin takes turns).
    if (policy !== "round-robin") {
      assertEquals(
        pick([cand("a", { loaded: false, load: 3 }), cand("b", { loaded: false, load: 1 })]),
        "b",
      );
    }
  }
  // Among several warm ones the policy decides: the prefix holder.
  const c = chooseReplica([
    cand("a", { loaded: true, load: 1, matchedBlocks: 3 }),
    cand("b", { loaded: true, load: 0 }),
    cand("c", { loaded: false, load: 0, matchedBlocks: 5 }),
  ], { policy: "prefix" });
  assertEquals(c.kind === "replica" ? `${c.id}:${c.reason}` : c.kind, "a:prefix");
});
