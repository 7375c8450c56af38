/**
 * The planner's layouts: the split of layers over stages, refusals naming the host and the
 * memory it lacks, predictions equal to the cost model's hand-worked values, and the order.
 */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import {
  layouts,
  planLayouts,
  type PlanOptions,
  type Prediction,
  predictLayout,
  splitLayers,
} from "../lib/cluster/plan_layouts.ts";
import type { PlanHost } from "../lib/cluster/plan_hosts.ts";
import { formatBytes } from "../lib/util/byte_size.ts";
import { CAL, LINK, MODEL } from "./_plan_fixtures.ts";

const OPTIONS: PlanOptions = {
  sequences: 2,
  context: 100,
  promptTokens: 10,
  kvElementBytes: 2,
  processOverheadBytes: 1000,
  // As plan_cost_test's hand-worked pipelines: the plan, not the logits, travels.
  head: "last",
};

function hosts(n: number, memoryBytes: number): PlanHost[] {
  return Array.from({ length: n }, (_, i) => ({
    name: `host ${i + 1}`,
    memoryBytes,
    threads: 1,
    speed: 1,
  }));
}

function predicted(p: ReturnType<typeof predictLayout>): Prediction {
  if ("refused" in p) throw new Error(p.refused);
  return p;
}

Deno.test("the split of layers keeps the largest stage cost least, each stage non-empty", () => {
  const w = [1, 1, 1, 1, 4];
  const sum = (_s: number, i: number, j: number) => w.slice(i, j).reduce((a, b) => a + b, 0);
  assertEquals(splitLayers(5, 2, sum), { counts: [4, 1], worst: 4 });
  assertEquals(splitLayers(5, 5, sum).counts, [1, 1, 1, 1, 1]);
  // A stage that cannot take a range (Infinity) is kept off it.
  const small = (s: number, i: number, j: number) => s === 0 && j - i > 1 ? Infinity : sum(s, i, j);
  assertEquals(splitLayers(5, 2, small), { counts: [1, 4], worst: 7 });
});

Deno.test("each TP degree (powers of two) with each PP the hosts allow, and as many replicas", () => {
  assertEquals(layouts(4, 80).map((l) => `${l.tp}×${l.pp}×${l.dp}`), [
    "1×1×4",
    "1×2×2",
    "1×3×1",
    "1×4×1",
    "2×1×2",
    "2×2×1",
    "4×1×1",
  ]);
  // No more stages than layers.
  assertEquals(layouts(4, 2).filter((l) => l.tp === 1).map((l) => l.pp), [1, 2]);
});

Deno.test("a layout that does not fit is refused naming the host and what it needs", () => {
  // The whole model on one host: 4.5 MB of weights, 2 sequences' KV, 1,000 bytes of process.
  const needs = 2e6 + 5e5 + 2e6 + 2 * 100 * 2 * 16 + 1000;
  const r = predictLayout(MODEL, { hosts: hosts(1, 3e6), link: LINK }, CAL, {
    tp: 1,
    pp: 1,
    dp: 1,
  }, OPTIONS);
  assertEquals(r, {
    refused: `does not fit: needs ${formatBytes(needs)} on host 1 (has ${formatBytes(3e6)})`,
  });
  // The last of two stages holds the classifier: there it falls short.
  const two = predictLayout(MODEL, { hosts: hosts(2, 3e6), link: LINK }, CAL, {
    tp: 1,
    pp: 2,
    dp: 1,
  }, OPTIONS);
  assertEquals(two, {
    refused: `does not fit: needs ${formatBytes(1e6 + 2e6 + 3200 + 1000)} on host 2 (has ${
      formatBytes(3e6)
    })`,
  });
  assertEquals(
    predictLayout(
      MODEL,
      { hosts: hosts(2, 1e9), link: LINK },
      CAL,
      { tp: 2, pp: 2, dp: 1 },
      OPTIONS,
    ),
    { refused: "needs 4 hosts, 2 given" },
  );
});

Deno.test("a pipeline's prediction is the cost model's, worked out by hand", () => {
  const p = predicted(
    predictLayout(
      MODEL,
      { hosts: hosts(2, 1e9), link: LINK },
      CAL,
      { tp: 1, pp: 2, dp: 1 },
      OPTIONS,
    ),
  );
  assertEquals(p.split, [1, 1]);
  // plan_cost_test's two stages: 2 groups of 1 row, stage 1 (5.0016 ms) busy twice a round.
  assert(Math.abs(p.tokensPerSecondN - 2 / (2 * 5.0016e-3)) < 1e-9);
  // One sequence alone: 1.0016 + 5.0016 ms of stages and 2.2 ms + 40 bytes of hops.
  const alone = 1.0016e-3 + 5.0016e-3 + 2.2e-3 + 40 * 1.1e-8;
  assert(Math.abs(p.tokensPerSecond1 - 1 / alone) < 1e-9);
});

Deno.test("replicas multiply the throughput at N sequences, not one sequence's speed", () => {
  const cluster = { hosts: hosts(2, 1e9), link: LINK };
  const one = predicted(predictLayout(MODEL, cluster, CAL, { tp: 1, pp: 1, dp: 1 }, {
    ...OPTIONS,
    sequences: 1,
  }));
  const two = predicted(predictLayout(MODEL, cluster, CAL, { tp: 1, pp: 1, dp: 2 }, OPTIONS));
  // A whole model in one process, one row: 2 ms + 3.2 µs of layers, 4 ms of classifier.
  assert(Math.abs(one.tokensPerSecond1 - 1 / 6.0032e-3) < 1e-9);
  assertEquals(two.tokensPerSecond1, one.tokensPerSecond1);
  assert(Math.abs(two.tokensPerSecondN - 2 * one.tokensPerSecondN) < 1e-9);
});

Deno.test("plans come best first by what is asked, those that do not fit last with why", () => {
  // Room for a TP rank 0 (1 MB of layers, the embedding, the whole classifier: 3.51 MB), not
  // for the whole model (4.51 MB).
  const cluster = { hosts: hosts(2, 3.6e6), link: LINK };
  const plans = planLayouts(MODEL, cluster, CAL, OPTIONS);
  const names = plans.map((p) => `${p.layout.tp}×${p.layout.pp}×${p.layout.dp} ${p.fits}`);
  // TP 2 reads half the layers, runs the whole classifier on rank 0 and gathers 8 outputs a
  // token, each a round trip over a 1 ms link (17.6 ms): the pipeline's two groups (10 ms a
  // round for both tokens) win.
  assertEquals(names, ["1×2×1 true", "2×1×1 true", "1×1×2 false"]);
  const rate = (i: number, by: keyof Prediction) => {
    const p = plans[i]!;
    return p.fits ? p.prediction[by] as number : NaN;
  };
  assert(rate(0, "tokensPerSecondN") > rate(1, "tokensPerSecondN"));
  assertStringIncludes(plans[0]!.why, "best");
  assertStringIncludes(plans[1]!.why, "× the best");
  assertStringIncludes(plans[1]!.why, "gathers");
  assertStringIncludes(plans[2]!.why, "does not fit: needs");
  // On loopback a message costs the transport's 0.1 ms. One sequence alone through two stages:
  // 1.0016 + 5.0016 ms and two hops (0.2 ms and 40 bytes). Over two ranks: 1 ms of layers,
  // 3.2 µs of attention, the 4 ms classifier, and 8 gathers of 2 messages (1.6 ms and 320
  // bytes): the 1 ms TP saves on the layers is less than its gathers cost.
  const loopback = { bandwidthBytesPerSecond: Infinity, latencySeconds: 0 };
  const byLatency = planLayouts(MODEL, { ...cluster, link: loopback }, CAL, OPTIONS, "latency");
  assertEquals(byLatency.map((p) => `${p.layout.tp}×${p.layout.pp}×${p.layout.dp}`), [
    "1×2×1",
    "2×1×1",
    "1×1×2",
  ]);
  const alone = (p: (typeof byLatency)[number]) => p.fits ? p.prediction.tokensPerSecond1 : NaN;
  const near = (a: number, b: number) => assert(Math.abs(a - b) < 1e-9 * b, `${a} against ${b}`);
  near(alone(byLatency[0]!), 1 / (6.0032e-3 + 2e-4 + 40e-9));
  near(alone(byLatency[1]!), 1 / (5.0032e-3 + 1.6e-3 + 320e-9));
});
