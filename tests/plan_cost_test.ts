/**
 * The planner's cost model against values worked out by hand for a small calibration, model and
 * link chosen so that each term is a round number.
 */
import { assertAlmostEquals, assertEquals } from "@std/assert";
import {
  attentionSeconds,
  classifierRates,
  gatherSeconds,
  type HeadPlace,
  hopSeconds,
  layerRates,
  matmulSeconds,
  messageSeconds,
  pipelineDecode,
  prefillSeconds,
  stageMemoryBytes,
  stageSeconds,
  type StageShape,
  tpGatherWidths,
} from "../lib/cluster/plan_cost.ts";
import { CAL, LINK, MODEL } from "./_plan_fixtures.ts";

const ONE = { threads: 1, speed: 1 };
const close = (actual: number, expected: number) =>
  assertAlmostEquals(actual, expected, Math.abs(expected) * 1e-9);

Deno.test("a matmul is bound by the weight read at few rows and by arithmetic at many", () => {
  const rates = layerRates(CAL);
  close(rates.readBytesPerSecond, 1e9);
  close(rates.computeSecondsPerByteRow, 2.5e-10);
  close(matmulSeconds(rates, 1e6, 1, ONE), 1e-3);
  close(matmulSeconds(rates, 1e6, 4, ONE), 1e-3);
  close(matmulSeconds(rates, 1e6, 8, ONE), 2e-3);
  // Threads and speed divide it; the classifier goes at its own rates.
  close(matmulSeconds(rates, 1e6, 8, { threads: 2, speed: 2 }), 5e-4);
  close(matmulSeconds(classifierRates(CAL), 2e6, 1, ONE), 4e-3);
  close(matmulSeconds(classifierRates(CAL), 2e6, 8, ONE), 16e-3);
  assertEquals(matmulSeconds(rates, 1e6, 0, ONE), 0);
});

Deno.test("attention reads each row's K and V for its context at the read rate; a rank reads its KV heads", () => {
  // 2 rows × 100 positions × (K and V: 2 × 1 head × 4 × 2 bytes) = 3,200 bytes at 1 GB/s.
  close(attentionSeconds(CAL, MODEL, 2, 100, 2, ONE), 3.2e-6);
  // The one KV head cannot be split: each of 2 ranks reads its copy whole.
  close(attentionSeconds(CAL, MODEL, 2, 100, 2, ONE, 2), 3.2e-6);
  // 4 KV heads over 2 ranks: 2 each, half the 4 heads' 12,800 bytes.
  const four = { ...MODEL, nKvHeads: 4 };
  close(attentionSeconds(CAL, four, 2, 100, 2, ONE), 12.8e-6);
  close(attentionSeconds(CAL, four, 2, 100, 2, ONE, 2), 6.4e-6);
});

Deno.test("a message costs latency, the transport's per-message cost and its bytes", () => {
  // 1 ms + 0.1 ms + 1000 × (1 + 10) ns.
  close(messageSeconds(CAL, LINK, 1000), 1.111e-3);
  close(
    messageSeconds(CAL, { bandwidthBytesPerSecond: Infinity, latencySeconds: 0 }, 1000),
    1.01e-4,
  );
});

Deno.test("a gather over N ranks is a round trip through rank 0: 2 latencies, 2 (N - 1) messages, (N - 1) × the bytes", () => {
  // In: 3 ranks' shares of 1,000 bytes; out: 3,000 bytes to each of 3 ranks. 2 × 1 ms +
  // 6 × 0.1 ms + 12,000 × 11 ns.
  close(gatherSeconds(CAL, LINK, 4000, 4), 2.732e-3);
  // 2 ranks: rank 1's half in, rank 0's half out.
  close(gatherSeconds(CAL, LINK, 4000, 2), 2.2e-3 + 4000 * 1.1e-8);
  assertEquals(gatherSeconds(CAL, LINK, 4000, 1), 0);
  // As built: attention heads' rows 2 × 4, the residual 8, the hidden rows 16, the residual 8.
  assertEquals(tpGatherWidths(MODEL), [8, 8, 16, 8]);
});

const whole: StageShape = {
  layerBytes: 2e6,
  layers: 2,
  first: true,
  last: true,
  host: ONE,
  ranks: 1,
};

Deno.test("a stage's time: its layers, their attention, the classifier where it is last", () => {
  // Layers 2 ms (read-bound), attention 2 × 1.6 µs, classifier 4 ms.
  const t = stageSeconds(CAL, MODEL, LINK, whole, 1, 100, 1, 2);
  close(t.compute, 6.0032e-3);
  assertEquals(t.gathers, 0);
  // Split over 2 ranks: each reads half the layers and its copy of the one KV head whole;
  // rank 0 runs the whole classifier. Each layer gathers its 4 outputs, a round trip each:
  // 2 latencies + 2 messages + the bytes.
  const tp = stageSeconds(CAL, MODEL, LINK, { ...whole, ranks: 2 }, 1, 100, 1, 2);
  close(tp.compute, 1e-3 + 3.2e-6 + 4e-3);
  const gather = (bytes: number) => 2.2e-3 + bytes * 1.1e-8;
  const perLayer = [8, 8, 16, 8].reduce((a, w) => a + gather(w * 4), 0);
  close(tp.gathers, 2 * perLayer);
});

/** Two stages of one layer each: the first holds the embedding, the last the classifier. */
const stages: StageShape[] = [
  { layerBytes: 1e6, layers: 1, first: true, last: false, host: ONE, ranks: 1 },
  { layerBytes: 1e6, layers: 1, first: false, last: true, host: ONE, ranks: 1 },
];

const run = (sequences: number, microBatches: boolean, head: HeadPlace = "last") => ({
  sequences,
  context: 100,
  kvElementBytes: 2,
  microBatches,
  head,
});

Deno.test("with micro-batches, a round lasts the busiest stage's work on every group", () => {
  // 2 sequences, 2 groups of 1 row. Stage 0: 1 ms + 1.6 µs; stage 1: the same + 4 ms.
  // Hops, the head in the last stage's process: the plan (8 bytes) to stage 0 and 32 bytes of
  // activations to stage 1.
  const d = pipelineDecode(CAL, MODEL, LINK, stages, run(2, true));
  const hops = 2.2e-3 + 40 * 1.1e-8;
  close(d.hops, hops);
  const t0 = 1.0016e-3, t1 = 5.0016e-3;
  // The trip round (8.2 ms) is shorter than stage 1's two groups (10.0 ms).
  close(d.roundSeconds, 2 * t1);
  close(d.tokensPerSecond, 2 / (2 * t1));
  close(d.bubble, 1 - 2 * (t0 + t1) / (2 * 2 * t1));
  assertEquals(d.groups, 2);
});

Deno.test("a head in the first stage's process gets the logits rows that sample instead", () => {
  // 32 bytes of activations to stage 1, then a row of 10 f32 logits back.
  const d = pipelineDecode(CAL, MODEL, LINK, stages, run(2, true, "first"));
  close(d.hops, 2.2e-3 + 72 * 1.1e-8);
  close(hopSeconds(CAL, MODEL, LINK, 2, 3, 3, "first"), 2.2e-3 + (96 + 120) * 1.1e-8);
  assertEquals(hopSeconds(CAL, MODEL, LINK, 1, 3, 3, "first"), 0);
});

Deno.test("without micro-batches, one group makes the whole trip while the other stages wait", () => {
  // One group of 2 rows: the layers stay read-bound, the classifier just reaches 4 ms.
  const d = pipelineDecode(CAL, MODEL, LINK, stages, run(2, false));
  const t0 = 1e-3 + 3.2e-6, t1 = t0 + 4e-3, hops = 2.2e-3 + 80 * 1.1e-8;
  close(d.roundSeconds, t0 + t1 + hops);
  close(d.tokensPerSecond, 2 / (t0 + t1 + hops));
  close(d.bubble, 1 - (t0 + t1) / (2 * (t0 + t1 + hops)));
});

Deno.test("micro-batches pay where the stages are compute-bound: two stages double the rate", () => {
  // No transport cost at all, so that only the stages' work and waits count.
  const compute = { ...CAL, transport: { how: "", messageSeconds: 0, byteSeconds: 0 } };
  const fast = { bandwidthBytesPerSecond: Infinity, latencySeconds: 0 };
  const even: StageShape[] = stages.map((s) => ({ ...s, last: false }));
  const at32 = { ...run(32, true), context: 1 };
  const withGroups = pipelineDecode(compute, MODEL, fast, even, at32);
  const without = pipelineDecode(compute, MODEL, fast, even, { ...at32, microBatches: false });
  // 32 rows: 8 ms a stage, 16 ms a trip; 2 groups of 16 rows: 4 ms a stage, both busy.
  assertAlmostEquals(without.tokensPerSecond / withGroups.tokensPerSecond, 0.5, 0.01);
  assertAlmostEquals(withGroups.bubble, 0, 0.01);
  assertAlmostEquals(without.bubble, 0.5, 0.01);
});

Deno.test("time to first token: the prompt through each stage as one batch, then one row sampled", () => {
  // 10 rows at 5 positions of context: layers max(1 ms, 10 × 0.25 ms) = 2.5 ms each,
  // attention 10 × 5 × 16 bytes = 0.8 µs each, the classifier 4 ms for the one row.
  const t = prefillSeconds(CAL, MODEL, LINK, stages, 10, 2, "last");
  const plan = 1.1e-3 + 80 * 1.1e-8, activations = 1.1e-3 + 320 * 1.1e-8;
  close(t, plan + 2.5008e-3 + activations + 2.5008e-3 + 4e-3);
});

Deno.test("a rank holds its layers' share, the embedding at the first stage, its KV heads; rank 0 of the last stage the classifier", () => {
  // 2 MB of layers + 0.5 MB embedding + 2 MB classifier + 4 sequences × 100 positions × 2
  // layers × 16 bytes + 1,000 bytes of process.
  assertEquals(stageMemoryBytes(MODEL, whole, 4, 100, 2, 1000), 4_513_800);
  // Over 2 ranks: half the layers; the classifier whole on rank 0; the one K/V head copied.
  assertEquals(stageMemoryBytes(MODEL, { ...whole, ranks: 2 }, 4, 100, 2, 1000), 3_513_800);
  // 4 K/V heads over 2 ranks: 2 each, the cache's 51,200 bytes halved.
  assertEquals(
    stageMemoryBytes({ ...MODEL, nKvHeads: 4 }, { ...whole, ranks: 2 }, 4, 100, 2, 1000),
    1e6 + 5e5 + 2e6 + 25_600 + 1000,
  );
  // A tied classifier in one process is the embedding, held once.
  assertEquals(
    stageMemoryBytes({ ...MODEL, tiedClassifier: true }, whole, 4, 100, 2, 1000),
    2_513_800,
  );
  // A last stage holds the classifier, not the embedding.
  assertEquals(stageMemoryBytes(MODEL, stages[1]!, 4, 100, 2, 0), 3_006_400);
});
