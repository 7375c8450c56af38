import { assert, assertEquals, assertThrows } from "@std/assert";
import { Channel } from "../actors/channel.ts";
import type { ExecutorMsg, SeqEvent } from "../actors/messages.ts";
import {
  createExecutorMailbox,
  SchedulerActor,
  type SchedulerActorOptions,
} from "../actors/scheduler.ts";
import type { Priority } from "../lib/core/generation.ts";
import { schedulerConfig } from "../lib/core/scheduler.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { FakeEngine } from "./harness/fake_engine.ts";

type StepMsg = Extract<ExecutorMsg, { type: "step" }>;

function stepOf(m: ExecutorMsg | undefined): StepMsg {
  if (m?.type !== "step") throw new Error(`expected a step message, got ${JSON.stringify(m)}`);
  return m;
}

/** The actor over a real Scheduler, with the test in the executor's place. */
function setup(maxInFlight = 2, opts: SchedulerActorOptions = {}) {
  const config = schedulerConfig(
    { numBlocks: 64, blockSize: 4, contextLength: 128, vocabSize: 64 },
    {
      maxRunning: 4,
    },
  );
  const executor = createExecutorMailbox(maxInFlight);
  const actor = new SchedulerActor(config, executor, { maxInFlight, ...opts });
  const running = actor.run();
  const events = new Map<number, SeqEvent[]>();
  const submit = (prompt: number[], maxTokens: number, priority: Priority = "interactive") => {
    const seqId = actor.nextSeqId();
    const log: SeqEvent[] = [];
    events.set(seqId, log);
    return actor.mailbox.send({
      type: "submit",
      seq: {
        seqId,
        prompt,
        maxTokens,
        sampling: GREEDY,
        stopTokenIds: [],
        priority,
      },
      reply: (e) => log.push(e),
    }).then(() => seqId);
  };
  /** Messages the actor has handed to the executor so far. */
  const sent = (): ExecutorMsg[] => {
    const out: ExecutorMsg[] = [];
    for (let m = executor.tryReceive(); m && !m.done; m = executor.tryReceive()) out.push(m.value);
    return out;
  };
  /** Lets the actor handle what is in its mailbox (its loop runs on the microtask queue). */
  const settle = () => new Promise((r) => setTimeout(r, 0));
  return { actor, executor, running, events, submit, sent, settle };
}

Deno.test("SchedulerActor refuses a pipeline depth below 1 and an executor mailbox that could refuse a plan", () => {
  const core = schedulerConfig({ numBlocks: 8, blockSize: 4, contextLength: 32, vocabSize: 64 });
  assertThrows(
    () => new SchedulerActor(core, createExecutorMailbox(2), { maxInFlight: 0 }),
    RangeError,
    "maxInFlight must be a positive integer, received 0",
  );
  assertThrows(
    () => new SchedulerActor(core, new Channel<ExecutorMsg>(3), { maxInFlight: 2 }),
    RangeError,
    "holds 3 plans, fewer than 2 × maxInFlight (4)",
  );
});

Deno.test("SchedulerActor keeps maxInFlight steps outstanding and plans the next as each result arrives", async () => {
  const t = setup(2);
  const engine = new FakeEngine({ numBlocks: 64, blockSize: 4, contextLength: 128 });
  const id = await t.submit([1, 5, 6], 6);
  await t.settle();
  const first = t.sent();
  assertEquals(first.map((m) => m.type), ["step", "step"], "two steps, no more, before any result");
  assertEquals(t.actor.stats().stepsInFlight, 2);
  for (const m of first) {
    if (m.type !== "step") continue;
    await t.actor.mailbox.send({
      type: "step-result",
      epoch: 0,
      result: engine.run(m.plan),
      durationMs: 1,
    });
  }
  await t.settle();
  const next = t.sent();
  assertEquals(next.filter((m) => m.type === "step").length, 2, "refilled to two");
  assertEquals(t.events.get(id)!.filter((e) => e.type === "token").length, 2);
  t.actor.mailbox.close();
  await t.running;
});

Deno.test("SchedulerActor drops results of a failed epoch and plans nothing until the executor is ready", async () => {
  const t = setup(1);
  const engine = new FakeEngine({ numBlocks: 64, blockSize: 4, contextLength: 128 });
  const id = await t.submit([1, 5, 6], 4);
  await t.settle();
  const m = stepOf(t.sent()[0]);
  await t.actor.mailbox.send({
    type: "executor-failed",
    epoch: 0,
    error: "lost",
    stepId: m.plan.stepId,
  });
  // A late result of the dead engine changes nothing, and nothing is planned while paused.
  await t.actor.mailbox.send({
    type: "step-result",
    epoch: 0,
    result: engine.run(m.plan),
    durationMs: 1,
  });
  await t.settle();
  assertEquals(t.sent(), []);
  assertEquals(t.events.get(id)!.filter((e) => e.type === "token"), []);
  await t.actor.mailbox.send({ type: "executor-ready", epoch: 1 });
  await t.settle();
  const again = stepOf(t.sent()[0]);
  assertEquals(again.epoch, 1);
  assertEquals(again.plan.seqs[0]!.startPos, 0, "recomputed from the start");
  t.actor.mailbox.close();
  await t.running;
});

Deno.test("SchedulerActor hands releases over on their own when no step follows, and fails all when it stops", async () => {
  const t = setup(1);
  const engine = new FakeEngine({ numBlocks: 64, blockSize: 4, contextLength: 128 });
  const done = await t.submit([1, 5], 1);
  const live = await t.submit([1, 7], 50);
  await t.settle();
  const m = stepOf(t.sent()[0]);
  await t.actor.mailbox.send({
    type: "step-result",
    epoch: 0,
    result: engine.run(m.plan),
    durationMs: 1,
  });
  await t.settle();
  // `done` finished with its one token; its release rides on the next step.
  const after = t.sent();
  assertEquals(after.length, 1);
  assert(stepOf(after[0]).release.includes(done), JSON.stringify(after[0]));
  // Cancel `live` while its step is out: nothing else to plan, so the release goes alone.
  await t.actor.mailbox.send({ type: "cancel", seqId: live });
  await t.settle();
  assertEquals(t.sent(), [{ type: "release", epoch: 0, release: [live] }]);
  assertEquals(t.events.get(live)!.at(-1)!.type, "finished");
  // A sequence still waiting when the actor stops is failed, and the executor told to stop.
  const orphan = await t.submit([1, 9], 5);
  t.actor.mailbox.close();
  await t.running;
  const last = t.events.get(orphan)!.at(-1)!;
  assert(
    last.type === "failed" && last.message.includes("scheduler stopped"),
    JSON.stringify(last),
  );
  assert(t.executor.closed);
});

Deno.test("SchedulerActor paces batch-only steps to backgroundShare of the engine's time while interactive work came recently, and not after a quiet spell", async () => {
  let clock = 1000;
  const t = setup(3, { backgroundShare: 0.25, backgroundQuietMs: 500, now: () => clock });
  const engine = new FakeEngine({ numBlocks: 64, blockSize: 4, contextLength: 128 });
  const result = async (m: ExecutorMsg | undefined, durationMs: number) => {
    await t.actor.mailbox.send({
      type: "step-result",
      epoch: 0,
      result: engine.run(stepOf(m).plan),
      durationMs,
    });
    await t.settle();
  };
  const steps = () => t.sent().filter((m) => m.type === "step");
  const batch = await t.submit([1, 5, 6], 40, "batch");
  await t.settle();
  const [b0, ...rest] = steps();
  assertEquals(stepOf(b0).plan.seqs.map((e) => e.seqId), [batch]);
  assertEquals(rest, [], "batch-only: one step in flight (backgroundDepth), not maxInFlight");
  const interactive = await t.submit([1, 7, 8], 1);
  await t.settle();
  // Planned at once behind the one batch step; the prefill's step holds no batch row, the
  // step after it (the interactive one now only decodes) does.
  const [i0, m1, ...none] = steps();
  assertEquals(stepOf(i0).plan.seqs.map((e) => e.seqId), [interactive]);
  assertEquals(stepOf(m1).plan.seqs.map((e) => e.seqId), [batch]);
  assertEquals(none, []);
  // Run what is in flight (instantly) until the interactive request is done.
  const queue = [b0, i0, m1];
  while (!t.events.get(interactive)!.some((e) => e.type === "finished") || queue.length > 1) {
    await result(queue.shift(), 0);
    queue.push(...steps());
  }
  assertEquals(queue.length, 1, "batch alone again: one step in flight");
  await result(queue[0], 0);
  const [b1, ...more] = steps();
  assertEquals(stepOf(b1).plan.seqs.map((e) => e.seqId), [batch]);
  assertEquals(more, []);
  // A 10 ms batch-only step at share 0.25 leaves the engine 30 ms before the next.
  await result(b1, 10);
  assertEquals(steps(), [], "paced: nothing before 30 ms have passed");
  clock += 29;
  await t.actor.mailbox.send({ type: "wake" });
  await t.settle();
  assertEquals(steps(), [], "still paced at 29 ms");
  clock += 1;
  await t.actor.mailbox.send({ type: "wake" });
  await t.settle();
  const [b2] = steps();
  assertEquals(stepOf(b2).plan.seqs.map((e) => e.seqId), [batch], "the next batch step at 30 ms");
  // Past backgroundQuietMs without interactive work, batch steps run back to back.
  clock += 500;
  await result(b2, 10);
  const [b3] = steps();
  assertEquals(stepOf(b3).plan.seqs.map((e) => e.seqId), [batch], "no pacing after a quiet spell");
  t.actor.mailbox.close();
  await t.running;
});

Deno.test("SchedulerActor with an adaptive depth keeps fewer steps in flight once its steps say they are long", async () => {
  const t = setup(8, { adaptiveDepth: { min: 3, latencyMs: 10 } });
  const engine = new FakeEngine({ numBlocks: 64, blockSize: 4, contextLength: 128 });
  await t.submit([1, 5, 6], 40);
  await t.settle();
  let pending = t.sent().map(stepOf);
  assertEquals(pending.length, 8, "the deepest before any result");
  // Steps that kept the engine busy 30 ms each: 2 + ceil(10 / 30) = 3.
  for (let i = 0; i < 8; i++) {
    const m = pending.shift()!;
    await t.actor.mailbox.send({
      type: "step-result",
      epoch: 0,
      result: { ...engine.run(m.plan), busyMs: 30 },
      durationMs: 40,
    });
    await t.settle();
    pending = pending.concat(t.sent().map(stepOf));
  }
  assertEquals([t.actor.pipelineDepth, pending.length], [3, 3]);
  t.actor.mailbox.close();
  await t.running;
});
