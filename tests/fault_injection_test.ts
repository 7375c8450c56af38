import { DEFAULT_LIMITS } from "../lib/engine/limits.ts";
import { assertEquals, assertRejects, assertThrows } from "@std/assert";
import { type Engine, GREEDY, type StepPlan } from "../lib/engine/engine.ts";
import { ServingCore } from "../actors/core.ts";
import { BOS, fakeCodec } from "./_fake_codec.ts";
import { FakeEngine } from "./harness/fake_engine.ts";
import { FaultInjector, parseFaultSteps } from "../lib/engine/fault_injection.ts";

const plan = (stepId: number, seqIds: number[]): StepPlan => ({
  stepId,
  seqs: seqIds.map((seqId, i) => ({
    seqId,
    tokens: [1, 2, 3],
    startPos: 0,
    blockTable: [i],
    sample: true,
    sampling: GREEDY,
  })),
});

Deno.test("parseFaultSteps() reads step numbers with optional kinds and names a bad entry", () => {
  assertEquals([...parseFaultSteps("3, 7:device-lost,9:crash")], [
    [3, "crash"],
    [7, "device-lost"],
    [9, "crash"],
  ]);
  assertThrows(() => parseFaultSteps("3,0"), Error, 'entry "0"');
  assertThrows(() => parseFaultSteps("4:melt"), Error, 'entry "4:melt"');
});

Deno.test("FaultInjector.fromEnv() is off unless LLMSERVE_FAULT_STEPS is set", () => {
  assertEquals(FaultInjector.fromEnv(() => undefined), undefined);
  assertEquals(FaultInjector.fromEnv(() => " "), undefined);
  assertEquals([...FaultInjector.fromEnv(() => "5")!.plan], [[5, "crash"]]);
});

Deno.test("a crash fault computes half the step, then throws; other steps pass through", async () => {
  const inj = new FaultInjector(parseFaultSteps("2"));
  const inner = new FakeEngine();
  const engine = inj.wrap(inner);
  const first = await engine.step(plan(0, [1]));
  assertEquals(first.sampled.length, 1);
  await assertRejects(() => engine.step(plan(1, [2, 3, 4, 5])), Error, "after 2 of 4 sequences");
  // The first half really ran: the fake engine computed 1 + 2 sequences' rows.
  assertEquals(inner.tokensComputed, 9);
  assertEquals((await engine.step(plan(2, [6]))).sampled.length, 1);
  assertEquals(inj.injected, 1);
});

Deno.test("a device-lost fault fails that engine for good; a new engine counts on from the same step", async () => {
  const inj = new FaultInjector(parseFaultSteps("1:device-lost,3"));
  const lost = inj.wrap(new FakeEngine());
  await assertRejects(() => lost.step(plan(0, [1])), Error, "device was lost at engine step 1");
  await assertRejects(() => lost.step(plan(1, [1])), Error, "device was lost");
  const fresh = inj.wrap(new FakeEngine());
  await assertRejects(() => fresh.step(plan(0, [1])), Error, "engine step 3");
  assertEquals(inj.steps, 3);
  assertEquals(inj.injected, 2);
});

Deno.test("a wrapped engine keeps the limits its step buffers were sized for, so the core stays within them", async () => {
  const inj = new FaultInjector(new Map());
  const limited = (): Engine =>
    Object.assign(new FakeEngine({ vocabSize: 64, numBlocks: 256, blockSize: 4 }), {
      limits: { maxSeqs: 3, maxBatchTokens: 8 },
    });
  const wrapped = inj.wrap(limited());
  assertEquals(wrapped.limits, { maxSeqs: 3, maxBatchTokens: 8 });
  assertEquals(inj.wrap(new FakeEngine()).limits, undefined);
  // End to end: the scheduler reads the limits off the engine it is given, the wrapped one.
  let widest = 0;
  const core = new ServingCore({
    engine: wrapped,
    engineFactory: () => inj.wrap(limited()),
    codec: fakeCodec,
    scheduler: { maxRunning: 64, maxBatchTokens: 512 },
    executor: { onStep: ({ plan }) => void (widest = Math.max(widest, plan.seqs.length)) },
  });
  try {
    const ends = await Promise.all(Array.from({ length: 8 }, async (_, i) => {
      let last = "";
      for await (
        const e of core.generate({
          prompt: [BOS, 2 + i, 3 + i],
          maxTokens: 4,
          sampling: GREEDY,
          stop: [],
          priority: "interactive",
          requestId: `l${i}`,
        })
      ) last = e.type;
      return last;
    }));
    assertEquals(ends, Array(8).fill("done"));
    assertEquals(widest, 3, "steps fill up to, and never past, the wrapped engine's 3 sequences");
  } finally {
    await core.close();
  }
});

Deno.test("a wrapped engine keeps its late masks and where its results land, so the core pipelines it as deep as the engine itself", async () => {
  const inj = new FaultInjector(new Map());
  const readback = inj.wrap(
    Object.assign(new FakeEngine({ resultsOnHost: false }), { lateMasks: true }),
  );
  assertEquals([readback.resultsOnHost, readback.lateMasks], [false, true]);
  const plain = inj.wrap(new FakeEngine());
  assertEquals([plain.resultsOnHost, plain.lateMasks], [undefined, undefined]);
  const core = new ServingCore({
    engine: readback,
    engineFactory: () => inj.wrap(new FakeEngine({ resultsOnHost: false })),
    codec: fakeCodec,
  });
  try {
    assertEquals(core.scheduler.maxInFlight, DEFAULT_LIMITS.readbackPipelineDepth);
  } finally {
    await core.close();
  }
});
