/** The hook for checking predictions against real runs on this machine. */
import { assert, assertAlmostEquals } from "@std/assert";
import { loopbackCluster, predictHere } from "../lib/cluster/plan_check.ts";
import { SHIPPED_CALIBRATION as CAL } from "../lib/cluster/plan_calibration.ts";
import { PLAN_SHAPES } from "../lib/cluster/plan_model.ts";
import type { PlanOptions } from "../lib/cluster/plan_layouts.ts";

const O: PlanOptions = {
  sequences: 32,
  context: 1,
  promptTokens: 16,
  kvElementBytes: 2,
  processOverheadBytes: 0,
  head: "first",
};
const model = PLAN_SHAPES.llama32_1b!;

function rates(layout: { tp: number; pp: number; dp: number }, threads = 1) {
  const p = predictHere(model, layout, threads, O);
  if ("refused" in p) throw new Error(p.refused);
  return p;
}

Deno.test("one process on one thread is predicted as the calibration timed its steps", () => {
  // The shipped calibration timed the 1B file: 16 layers and the classifier, per step.
  const p = rates({ tp: 1, pp: 1, dp: 1 });
  const step1 = 16 * CAL.layerSeconds.rows1 + CAL.classifierSeconds.rows1;
  const step32 = 16 * CAL.layerSeconds.rows32 + CAL.classifierSeconds.rows32;
  assertAlmostEquals(1 / p.tokensPerSecond1, step1, step1 * 0.01);
  assertAlmostEquals(32 / p.tokensPerSecondN, step32, step32 * 0.01);
});

Deno.test("the issue's loopback layouts: micro-batched PP 2 near twice one thread at 32", () => {
  const one = rates({ tp: 1, pp: 1, dp: 1 });
  const pp2 = rates({ tp: 1, pp: 2, dp: 1 });
  assert(pp2.tokensPerSecondN / one.tokensPerSecondN > 1.6);
  // Without micro-batches a pipeline is one process with a hop: about 1.0×.
  assertAlmostEquals(pp2.tokensPerSecondNNoMicroBatches / one.tokensPerSecondN, 1, 0.1);
  // TP 2 at one sequence: each rank reads half the weights, less what the gathers cost.
  const tp2 = rates({ tp: 2, pp: 1, dp: 1 });
  assert(tp2.tokensPerSecond1 > one.tokensPerSecond1);
  assert(tp2.tokensPerSecond1 < 2 * one.tokensPerSecond1);
  assert(loopbackCluster(2, 1, 1).link.latencySeconds === 0);
});
