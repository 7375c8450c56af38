/**
 * Scheduler CPU cost per iteration: building one step's plan and applying one step's sampled
 * tokens, with N sequences decoding (pipelined two steps deep, as the actor runs it). The fake
 * engine's work is outside the timed region. Finished sequences are replaced, so N stay
 * running and the cost of finishing, freeing and admitting is included.
 *
 * A second table runs the same workload through the actors (SchedulerActor ⇄ ExecutorActor over
 * their mailboxes, two steps in flight) and splits each step's wall time into the fake engine's
 * share and the rest: scheduler, mailboxes and promise hops.
 *
 *   deno run -A bench/scheduler_bench.ts [--iters 2000] [--sizes 1,64,256,1024]
 */
import { parseArgs } from "@std/cli/parse-args";
import { ExecutorActor } from "../actors/executor.ts";
import type { SeqEvent } from "../actors/messages.ts";
import { createExecutorMailbox, SchedulerActor } from "../actors/scheduler.ts";
import { GREEDY, type StepPlan, type StepResult } from "../lib/engine/engine.ts";
import { FakeEngine } from "../tests/harness/fake_engine.ts";
import { Scheduler, schedulerConfig } from "../lib/core/scheduler.ts";

const EOS = 2;
/** A Llama-2-sized vocabulary. */
const VOCAB = 32000;

export interface Row {
  running: number;
  medianUs: number;
  p99Us: number;
  meanUs: number;
  avgBatch: number;
}

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
}

export function measure(running: number, iters: number): Row {
  const blockSize = 16, contextLength = 2048;
  const numBlocks = Math.ceil((running * 1024) / blockSize);
  const engine = new FakeEngine({ vocabSize: VOCAB, numBlocks, blockSize, contextLength });
  const sched = new Scheduler(
    schedulerConfig({ numBlocks, blockSize, contextLength, vocabSize: VOCAB }, {
      maxRunning: running,
      maxBatchTokens: Math.max(512, running),
      maxWaiting: running * 4,
    }),
  );
  let nextId = 1, seed = 1;
  const submit = () => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    const prompt = Array.from({ length: 64 }, (_, i) => (seed + i * 7919) % 32000);
    sched.submit({
      seqId: nextId++,
      prompt,
      maxTokens: 128 + (seed % 512),
      sampling: GREEDY,
      stopTokenIds: [EOS],
      priority: seed % 4 === 0 ? "batch" : "interactive",
    });
  };
  for (let i = 0; i < running; i++) submit();

  const inFlight: StepResult[] = [];
  const samples: number[] = [];
  let batchSum = 0;
  const warmup = Math.max(200, Math.ceil((running * 64) / 512) + 50);
  for (let it = 0; it < warmup + iters; it++) {
    while (sched.numLive < running) submit();
    const t0 = performance.now();
    if (inFlight.length === 2) sched.onResult(inFlight.shift()!);
    let plan = sched.schedule();
    // A sequence at its token limit waits for its last results before anything can be planned.
    while (!plan && inFlight.length > 0) {
      sched.onResult(inFlight.shift()!);
      while (sched.numLive < running) submit();
      plan = sched.schedule();
    }
    const t1 = performance.now();
    if (!plan) throw new Error(`no plan at iteration ${it}`);
    for (const id of sched.takeReleased()) engine.release(id);
    inFlight.push(engine.run(plan));
    if (it >= warmup) {
      samples.push((t1 - t0) * 1000);
      batchSum += plan.seqs.length;
    }
  }
  samples.sort((a, b) => a - b);
  return {
    running,
    medianUs: percentile(samples, 0.5),
    p99Us: percentile(samples, 0.99),
    meanUs: samples.reduce((a, b) => a + b, 0) / samples.length,
    avgBatch: batchSum / iters,
  };
}

export interface ActorRow {
  running: number;
  steps: number;
  wallUs: number;
  engineUs: number;
}

/** Per-step wall time of the actor pipeline with `running` sequences kept decoding. */
export async function measureActors(running: number, steps: number): Promise<ActorRow> {
  const blockSize = 16, contextLength = 2048;
  const numBlocks = Math.ceil((running * 1024) / blockSize);
  const fake = new FakeEngine({ vocabSize: VOCAB, numBlocks, blockSize, contextLength });
  let engineMs = 0, engineSteps = 0;
  const engine = {
    name: fake.name,
    config: fake.config,
    kv: fake.kv,
    step(plan: StepPlan): Promise<StepResult> {
      const t = performance.now();
      const r = fake.run(plan);
      engineMs += performance.now() - t;
      engineSteps++;
      return Promise.resolve(r);
    },
    release: (id: number) => fake.release(id),
    dispose() {},
  };
  const config = schedulerConfig({ numBlocks, blockSize, contextLength, vocabSize: VOCAB }, {
    maxRunning: running,
    maxBatchTokens: Math.max(512, running),
    maxWaiting: running * 4,
  });
  const execMailbox = createExecutorMailbox(2);
  const actor = new SchedulerActor(config, execMailbox, { maxInFlight: 2 });
  const executor = new ExecutorActor(engine, () => engine, execMailbox, actor.mailbox);
  const loops = Promise.all([actor.run(), executor.run()]);
  let seed = 1, started = -1, startSteps = 0;
  const warmupSteps = Math.max(100, Math.ceil((running * 64) / 512) + 20);
  let done!: (v: number) => void;
  const finished = new Promise<number>((r) => (done = r));
  const submit = () => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    actor.mailbox.trySend({
      type: "submit",
      seq: {
        seqId: actor.nextSeqId(),
        prompt: Array.from({ length: 64 }, (_, i) => (seed + i * 7919) % 32000),
        maxTokens: 128 + (seed % 512),
        sampling: GREEDY,
        stopTokenIds: [EOS],
        priority: "interactive",
      },
      reply,
    });
  };
  function reply(e: SeqEvent) {
    if (e.type === "finished" && !actor.mailbox.closed) submit();
    if (e.type !== "token") return;
    if (started < 0 && engineSteps >= warmupSteps) {
      started = performance.now();
      startSteps = engineSteps;
      engineMs = 0;
    }
    if (started >= 0 && engineSteps - startSteps >= steps) done(performance.now());
  }
  for (let i = 0; i < running; i++) submit();
  const end = await finished;
  const measured = engineSteps - startSteps;
  const engineUs = (engineMs * 1000) / measured;
  actor.mailbox.close();
  await loops;
  return { running, steps: measured, wallUs: ((end - started) * 1000) / measured, engineUs };
}

if (import.meta.main) {
  const args = parseArgs(Deno.args, {
    string: ["iters", "sizes"],
    default: { iters: "2000", sizes: "1,64,256,1024" },
  });
  const iters = Number(args.iters);
  const sizes = String(args.sizes).split(",").map(Number);
  const rows = sizes.map((n) => measure(n, iters));
  console.log(
    `Scheduler iteration (plan one step + apply one step's tokens), ${iters} iterations, fake engine excluded`,
  );
  console.log("| running | avg batch | median µs | p99 µs | mean µs |");
  console.log("|--------:|----------:|----------:|-------:|--------:|");
  for (const r of rows) {
    console.log(
      `| ${r.running} | ${r.avgBatch.toFixed(1)} | ${r.medianUs.toFixed(1)} | ${
        r.p99Us.toFixed(1)
      } | ${r.meanUs.toFixed(1)} |`,
    );
  }
  console.log(`\nActor pipeline (SchedulerActor ⇄ ExecutorActor, 2 steps in flight), per step`);
  console.log("| running | steps | wall µs | fake engine µs | scheduler + actors µs |");
  console.log("|--------:|------:|--------:|---------------:|----------------------:|");
  for (const n of sizes) {
    const r = await measureActors(n, Math.min(iters, 1000));
    console.log(
      `| ${r.running} | ${r.steps} | ${r.wallUs.toFixed(1)} | ${r.engineUs.toFixed(1)} | ${
        (r.wallUs - r.engineUs).toFixed(1)
      } |`,
    );
  }
}
