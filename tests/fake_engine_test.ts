import { assertEquals, assertNotEquals, assertThrows } from "@std/assert";
import { GREEDY, type SeqInput } from "../lib/engine/engine.ts";
import { fakeContinuation, FakeEngine } from "./harness/fake_engine.ts";

const BLOCK = 16;
const promptA = Array.from({ length: 40 }, (_, i) => (i * 7 + 3) % 64);
const promptB = Array.from({ length: 40 }, (_, i) => (i * 11 + 5) % 64);

/** Prefills A into blocks 0-2 and B into blocks 3-5, then decodes A's first sampled token. */
function decodeA(tableA: number[]): number {
  const engine = new FakeEngine({ vocabSize: 64, numBlocks: 8, blockSize: BLOCK });
  const input = (seqId: number, tokens: number[], blockTable: number[]): SeqInput => ({
    seqId,
    tokens,
    startPos: 0,
    blockTable,
    sample: true,
    sampling: GREEDY,
  });
  const first = engine.run({
    stepId: 0,
    seqs: [input(1, promptA, [0, 1, 2]), input(2, promptB, [3, 4, 5])],
  });
  const next = engine.run({
    stepId: 1,
    seqs: [{
      seqId: 1,
      tokens: [first.sampled[0]!.token],
      startPos: promptA.length,
      blockTable: tableA,
      sample: true,
      sampling: GREEDY,
    }],
  });
  return next.sampled[0]!.token;
}

Deno.test("FakeEngine: a decode through the right block table yields the solo continuation", () => {
  const solo = fakeContinuation(promptA, {
    maxTokens: 2,
    contextLength: 2048,
    vocabSize: 64,
    sampling: GREEDY,
  });
  assertEquals(decodeA([0, 1, 2]), solo[1]);
});

Deno.test("FakeEngine: a wrong FIRST block-table entry changes the sampled token", () => {
  // Block 3 holds positions 0..15 too, of another sequence: a real engine would attend to the
  // wrong keys without any error, so only the token can tell.
  assertNotEquals(decodeA([3, 1, 2]), decodeA([0, 1, 2]));
});

Deno.test("FakeEngine: a wrong middle block-table entry changes the sampled token", () => {
  assertNotEquals(decodeA([0, 4, 2]), decodeA([0, 1, 2]));
});

Deno.test("FakeEngine: a table entry pointing at a block nobody wrote is an error naming it", () => {
  assertThrows(() => decodeA([7, 1, 2]), Error, "through table entry 0, which holds position -1");
});
