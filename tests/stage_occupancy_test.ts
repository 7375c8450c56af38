import { assertAlmostEquals, assertEquals } from "@std/assert";
import { StageOccupancy } from "../lib/engine/stage_occupancy.ts";

Deno.test("bubble fraction: the share of the time the pipeline had work that a stage had none; idle time with no work does not count", () => {
  let t = 0;
  const o = new StageOccupancy(2, () => t);
  assertEquals([o.bubbleFraction(0), o.bubbleFraction(1)], [0, 0]);
  t = 100; // nothing in flight: not the pipeline's working time
  o.sent(0); // stage 0 busy 100..110
  t = 110;
  o.answered(0);
  o.sent(1); // stage 1 busy 110..130, stage 0 again from 115 (two micro-batches queued)
  t = 115;
  o.sent(0);
  o.sent(0);
  assertEquals(o.depth(0), 2);
  t = 130;
  o.answered(1);
  o.answered(0);
  t = 140;
  o.answered(0);
  assertEquals([o.depth(0), o.depth(1)], [0, 0]);
  t = 1000; // idle again
  // Work from 100 to 140 (40): stage 0 busy 10 + 25 = 35, stage 1 busy 20.
  assertAlmostEquals(o.bubbleFraction(0), 5 / 40);
  assertAlmostEquals(o.bubbleFraction(1), 20 / 40);
});
