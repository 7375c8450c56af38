/**
 * Prefix caching on and off for requests that share a long system prompt: time to first
 * token, prompt tokens the engine computed, and whether the outputs stay the same (greedy).
 */
import type { BackendChoice } from "../lib/compose/engine_factory.ts";
import { DEFAULT_LIMITS } from "../lib/engine/limits.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import {
  type BenchModel,
  type GenRecord,
  makeCore,
  promptIds,
  timedGeneration,
} from "./compare_common.ts";
import { fmt, ratio, summarize, type Summary, table } from "./stats.ts";
import { drawLength, type LengthDist, seededRandom, storyWords } from "./workload.ts";

export interface PrefixOptions {
  readonly requests: number;
  readonly systemTokens: number;
  readonly userTokens: LengthDist;
  readonly maxTokens: number;
  /** Requests in flight at once. */
  readonly concurrency: number;
  readonly seed: number;
  readonly backend: BackendChoice;
}

export interface PrefixSide {
  readonly ttftMs: Summary;
  readonly prefillRows: number;
  readonly cachedTokens: number;
  readonly promptTokens: number;
  readonly wallSeconds: number;
}

export interface PrefixResult {
  readonly options: PrefixOptions;
  readonly on: PrefixSide;
  readonly off: PrefixSide;
  readonly sameOutputs: boolean;
  readonly markdown: string;
}

async function run(
  bm: BenchModel,
  prompts: readonly number[][],
  o: PrefixOptions,
  caching: boolean,
) {
  const longest = Math.max(...prompts.map((p) => p.length)) + o.maxTokens;
  const blockSize = DEFAULT_LIMITS.blockSize;
  const numBlocks = Math.ceil(longest / blockSize) * (o.concurrency + 8) * 2;
  const { core, probe } = await makeCore(bm, o.backend, { numBlocks, blockSize }, {
    prefixCaching: caching,
    maxWaiting: prompts.length,
  });
  const recs: GenRecord[] = new Array(prompts.length);
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: o.concurrency }, async () => {
    for (let i = next++; i < prompts.length; i = next++) {
      recs[i] = await timedGeneration(core, {
        prompt: prompts[i]!,
        maxTokens: o.maxTokens,
        sampling: GREEDY,
      });
    }
  }));
  const wallSeconds = (performance.now() - t0) / 1000;
  await core.close();
  const side: PrefixSide = {
    ttftMs: summarize(recs.map((r) => r.firstToken! - r.arrival)),
    prefillRows: probe.counters.prefillRows,
    cachedTokens: recs.reduce((s, r) => s + r.cachedTokens, 0),
    promptTokens: prompts.reduce((s, p) => s + p.length, 0),
    wallSeconds,
  };
  return { side, recs };
}

export async function comparePrefix(bm: BenchModel, o: PrefixOptions): Promise<PrefixResult> {
  const rand = seededRandom(o.seed);
  const system = promptIds(bm.tokenizer, storyWords(o.systemTokens, rand), o.systemTokens);
  const prompts = Array.from({ length: o.requests }, () => {
    const n = drawLength(o.userTokens, rand);
    const user = bm.tokenizer.encode(storyWords(n, rand), { bos: false }).slice(0, n);
    return [...system, ...user];
  });
  const off = await run(bm, prompts, o, false);
  const on = await run(bm, prompts, o, true);
  const sameOutputs = on.recs.every((r, i) => r.tokens.join() === off.recs[i]!.tokens.join());
  const a = on.side, b = off.side;
  const rows = [
    ["TTFT p50 (ms)", fmt(a.ttftMs.p50), fmt(b.ttftMs.p50), ratio(a.ttftMs.p50, b.ttftMs.p50)],
    ["TTFT p99 (ms)", fmt(a.ttftMs.p99), fmt(b.ttftMs.p99), ratio(a.ttftMs.p99, b.ttftMs.p99)],
    [
      "prompt tokens computed",
      String(a.prefillRows),
      String(b.prefillRows),
      ratio(a.prefillRows, b.prefillRows),
    ],
    ["prompt tokens from the cache", String(a.cachedTokens), String(b.cachedTokens), "–"],
    [
      "wall time (s)",
      fmt(a.wallSeconds, 2),
      fmt(b.wallSeconds, 2),
      ratio(a.wallSeconds, b.wallSeconds),
    ],
  ];
  const markdown = [
    "### Prefix caching on vs off",
    "",
    `${o.requests} requests sharing a ${o.systemTokens}-token system prompt, each with its own ${o.userTokens.min}–${o.userTokens.max}-token user part ` +
    `(${a.promptTokens} prompt tokens in all), ${o.maxTokens} greedy output tokens, ${o.concurrency} at a time, ${o.backend} engine. ` +
    `Outputs identical with and without the cache: ${sameOutputs ? "yes" : "NO"}.`,
    "",
    table(["", "cache on", "cache off", "on / off"], rows),
  ].join("\n");
  return { options: o, on: a, off: b, sameOutputs, markdown };
}
