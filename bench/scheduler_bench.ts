/**
 * Scheduler CPU cost per iteration: building one step's plan and applying one step's sampled
 * tokens, with N sequences decoding (pipelined two steps deep, as the actor runs it). The fake
 * engine's work is outside the timed region. Finished sequences are replaced, so N stay
 * running and the cost of finishing, freeing and admitting is included.
 *
 *   deno run -A bench/scheduler_bench.ts [--iters 2000] [--sizes 1,64,256,1024]
 */
import { parseArgs } from "@std/cli/parse-args";
import { GREEDY, type StepResult } from "../lib/engine.ts";
import { FakeEngine } from "../lib/fake_engine.ts";
import { Scheduler, schedulerConfig } from "../lib/scheduler.ts";

const EOS = 2;

interface Row {
  running: number;
  medianUs: number;
  p99Us: number;
  meanUs: number;
  avgBatch: number;
}

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
}

function measure(running: number, iters: number): Row {
  const blockSize = 16, contextLength = 2048;
  const numBlocks = Math.ceil((running * 1024) / blockSize);
  const engine = new FakeEngine({ vocabSize: 32000, numBlocks, blockSize, contextLength });
  const sched = new Scheduler(schedulerConfig({ numBlocks, blockSize, contextLength }, {
    maxRunning: running,
    maxBatchTokens: Math.max(512, running),
    maxWaiting: running * 4,
  }));
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
    }, () => {});
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
}
