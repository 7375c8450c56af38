/**
 * Interactive requests arriving while batch work saturates the server: their time to first
 * token when they are sent as "interactive" (priority on) and when the same requests are sent
 * as "batch" like everything else (priority off).
 */
import type { BackendChoice } from "../lib/compose/engine_factory.ts";
import { DEFAULT_LIMITS } from "../lib/engine/limits.ts";
import type { Priority } from "../lib/core/generation.ts";
import {
  type BenchModel,
  type GenRecord,
  makeCore,
  promptIds,
  sleep,
  timedGeneration,
} from "./compare_common.ts";
import { fmt, ratio, summarize, type Summary, table } from "./stats.ts";
import { poissonArrivals, seededRandom, storyWords } from "./workload.ts";

export interface PriorityOptions {
  /** Closed-loop batch clients (more than maxRunning, so a queue builds). */
  readonly batchClients: number;
  readonly batchPromptTokens: number;
  readonly batchMaxTokens: number;
  readonly interactiveRequests: number;
  readonly interactiveRatePerSecond: number;
  readonly interactivePromptTokens: number;
  readonly interactiveMaxTokens: number;
  readonly maxRunning: number;
  readonly seed: number;
  readonly backend: BackendChoice;
}

export interface PrioritySide {
  readonly interactiveTtftMs: Summary;
  readonly interactiveE2eMs: Summary;
  readonly batchOutputTokensPerSecond: number;
  /** Batch requests finished during the interactive window (after one finished in warm-up). */
  readonly batchCompleted: number;
}

export interface PriorityResult {
  readonly options: PriorityOptions;
  readonly on: PrioritySide;
  readonly off: PrioritySide;
  readonly markdown: string;
}

async function run(
  bm: BenchModel,
  o: PriorityOptions,
  interactivePriority: Priority,
): Promise<PrioritySide> {
  const rand = seededRandom(o.seed);
  const batchPrompt = promptIds(
    bm.tokenizer,
    storyWords(o.batchPromptTokens, rand),
    o.batchPromptTokens,
  );
  const interactive = Array.from(
    { length: o.interactiveRequests },
    () =>
      promptIds(
        bm.tokenizer,
        storyWords(o.interactivePromptTokens, rand),
        o.interactivePromptTokens,
      ),
  );
  const arrivals = poissonArrivals(o.interactiveRequests, o.interactiveRatePerSecond, rand);
  const blockSize = DEFAULT_LIMITS.blockSize;
  const perSeq = Math.ceil((o.batchPromptTokens + o.batchMaxTokens) / blockSize) + 1;
  const { core } = await makeCore(bm, o.backend, {
    numBlocks: perSeq * (o.maxRunning + 4) * 2,
    blockSize,
  }, {
    maxRunning: o.maxRunning,
    maxWaiting: o.batchClients + o.interactiveRequests,
  });
  const stop = new AbortController();
  let batchTokens = 0, batchCompleted = 0, seed = 0;
  const firstBatchDone = Promise.withResolvers<void>();
  let windowOpen = false;
  const batch = Array.from({ length: o.batchClients }, async () => {
    while (!stop.signal.aborted) {
      const r = await timedGeneration(core, {
        prompt: batchPrompt,
        maxTokens: o.batchMaxTokens,
        sampling: { temperature: 0.8, topK: 0, topP: 0.95, minP: 0, seed: seed++ },
        priority: "batch",
      }, stop.signal);
      batchTokens += r.tokens.length;
      if (r.error) {
        // Before the window a failing batch request would otherwise leave the warm-up waiting.
        if (!stop.signal.aborted) {
          firstBatchDone.reject(new Error(`batch request failed: ${r.error}`));
        }
        continue;
      }
      firstBatchDone.resolve();
      if (windowOpen) batchCompleted++;
    }
  });
  // Let the batch load fill the running set and the queue first, and finish one request, so
  // the window starts with batch work known to be moving however slow the machine.
  const warmStart = performance.now();
  await Promise.all([sleep(300), firstBatchDone.promise]);
  const t0 = performance.now();
  const warmUp = (t0 - warmStart) / 1000;
  windowOpen = true;
  const recs: GenRecord[] = await Promise.all(interactive.map(async (prompt, i) => {
    await sleep(t0 + arrivals[i]! - performance.now());
    return await timedGeneration(
      core,
      {
        prompt,
        maxTokens: o.interactiveMaxTokens,
        sampling: { temperature: 0.8, topK: 0, topP: 0.95, minP: 0, seed: 1_000_000 + i },
        priority: interactivePriority,
      },
      undefined,
      t0 + arrivals[i]!,
    );
  }));
  const window = (performance.now() - t0) / 1000;
  const tokensInWindow = batchTokens;
  stop.abort();
  await Promise.all(batch);
  await core.close();
  return {
    interactiveTtftMs: summarize(recs.map((r) => r.firstToken! - r.arrival)),
    interactiveE2eMs: summarize(recs.map((r) => r.end! - r.arrival)),
    // Batch tokens of requests finished before the window ended (plus the warm-up's).
    batchOutputTokensPerSecond: tokensInWindow / (window + warmUp),
    batchCompleted,
  };
}

export async function comparePriority(bm: BenchModel, o: PriorityOptions): Promise<PriorityResult> {
  const on = await run(bm, o, "interactive");
  const off = await run(bm, o, "batch");
  const rows = [
    [
      "interactive TTFT p50 (ms)",
      fmt(on.interactiveTtftMs.p50),
      fmt(off.interactiveTtftMs.p50),
      ratio(on.interactiveTtftMs.p50, off.interactiveTtftMs.p50, 3),
    ],
    [
      "interactive TTFT p99 (ms)",
      fmt(on.interactiveTtftMs.p99),
      fmt(off.interactiveTtftMs.p99),
      ratio(on.interactiveTtftMs.p99, off.interactiveTtftMs.p99, 3),
    ],
    [
      "interactive e2e p99 (ms)",
      fmt(on.interactiveE2eMs.p99),
      fmt(off.interactiveE2eMs.p99),
      ratio(on.interactiveE2eMs.p99, off.interactiveE2eMs.p99, 3),
    ],
    [
      "batch output tokens/s",
      fmt(on.batchOutputTokensPerSecond, 0),
      fmt(off.batchOutputTokensPerSecond, 0),
      ratio(on.batchOutputTokensPerSecond, off.batchOutputTokensPerSecond),
    ],
  ];
  const markdown = [
    "### Interactive vs batch priority under saturating batch load",
    "",
    `${o.batchClients} closed-loop batch clients (${o.batchPromptTokens}-token prompts, ${o.batchMaxTokens} tokens each) against ${o.maxRunning} running slots; ` +
    `${o.interactiveRequests} interactive requests (${o.interactivePromptTokens}-token prompts, ${o.interactiveMaxTokens} tokens) arriving at ${o.interactiveRatePerSecond}/s, ` +
    `sent as "interactive" (priority on) or as "batch" (priority off); ${o.backend} engine.`,
    "",
    table(["", "priority on", "priority off", "on / off"], rows),
  ].join("\n");
  return { options: o, on, off, markdown };
}
