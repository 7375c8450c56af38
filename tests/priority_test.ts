import { assertEquals } from "@std/assert";
import { rank, rankOneLive } from "../lib/core/priority.ts";
import { Sequence } from "../lib/core/sequence.ts";
import type { Priority } from "../lib/core/generation.ts";
import { GREEDY } from "../lib/engine/engine.ts";

const AGING = 10;

function seq(seqId: number, priority: Priority, arrivalStep = 0): Sequence {
  const spec = {
    seqId,
    prompt: [1, 2, 3],
    maxTokens: 4,
    sampling: GREEDY,
    stopTokenIds: [],
    priority,
  };
  return Sequence.fromSpec(spec, 7, arrivalStep, seqId);
}

Deno.test("rankOneLive() is true only while batch work that is not held and not aged is live", () => {
  const at = (step: number) => (s: Sequence) => rank(s, step, AGING);
  const interactive = seq(1, "interactive");
  const batch = seq(2, "batch");
  assertEquals(rankOneLive([], at(0)), false);
  assertEquals(rankOneLive([interactive], at(0)), false);
  assertEquals(rankOneLive([interactive, batch], at(0)), true);
  assertEquals(rankOneLive([batch], at(AGING - 1)), true);
  // Aged past agingSteps, batch work ranks as interactive: it no longer shortens the pipeline.
  assertEquals(rankOneLive([interactive, batch], at(AGING)), false);
  // A held sequence (its client stopped reading) gets no rows, so it holds nothing back either.
  batch.held = true;
  assertEquals(rankOneLive([interactive, batch], at(0)), false);
});
