/**
 * Continuous (iteration-level) batching against static batching on the same engine and the
 * same arrival trace. Static batching, as request-level batching servers did it: when the
 * engine is free, up to B waiting requests form a batch that runs to completion; nobody joins
 * or leaves it; prompts are padded to the longest prompt and every member keeps decoding
 * until the longest output is done. Padding rows are really computed (the engine does the
 * work a padded tensor would), in throwaway rows that do not touch the members' KV, so the
 * useful tokens are the same as the continuous run's.
 */
import type { SamplingParams, SeqInput, StepPlan } from "../lib/engine/engine.ts";
import { type BackendChoice, createEngine } from "../lib/compose/engine_factory.ts";
import {
  type BenchModel,
  type GenRecord,
  makeCore,
  promptIds,
  sleep,
  timedGeneration,
} from "./compare_common.ts";
import { logicalClock, type ReplayClock, wallClock } from "./replay_clock.ts";
import { fmt, pct, ratio, summarize, type Summary, table } from "./stats.ts";
import {
  drawLength,
  type LengthDist,
  poissonArrivals,
  seededRandom,
  storyWords,
} from "./workload.ts";

export interface BatchingOptions {
  readonly requests: number;
  readonly ratePerSecond: number;
  readonly batchSize: number;
  readonly promptTokens: LengthDist;
  readonly outputTokens: LengthDist;
  readonly seed: number;
  readonly backend: BackendChoice;
  readonly maxBatchTokens: number;
  /**
   * When set, the static run is replayed on a logical clock on which each engine step takes
   * this many ms: its batches then do not depend on the machine's speed (the smoke test's
   * padding), and its times are logical. Unset: the wall clock, as measured for the tables.
   */
  readonly logicalStepMs?: number;
}

export interface TraceItem {
  /** Arrival offset from the start, ms. */
  readonly at: number;
  readonly prompt: number[];
  readonly maxTokens: number;
  readonly sampling: SamplingParams;
}

export interface PolicyResult {
  readonly wallSeconds: number;
  readonly outputTokens: number;
  readonly outputTokensPerSecond: number;
  readonly ttftMs: Summary;
  readonly e2eMs: Summary;
  /** Token rows the engine computed (prefill + decode, padding included). */
  readonly computedRows: number;
  readonly paddingRows: number;
}

export interface BatchingResult {
  readonly options: BatchingOptions;
  readonly continuous: PolicyResult;
  readonly static: PolicyResult;
  readonly sameTokens: boolean;
  readonly markdown: string;
}

/** The seeded arrival trace: Poisson arrivals, story prompts, uniform output lengths. */
export function batchingTrace(bm: BenchModel, o: BatchingOptions): TraceItem[] {
  const rand = seededRandom(o.seed);
  const arrivals = poissonArrivals(o.requests, o.ratePerSecond, rand);
  return arrivals.map((at, i) => {
    const n = drawLength(o.promptTokens, rand);
    return {
      at,
      prompt: promptIds(bm.tokenizer, storyWords(n, rand), n),
      maxTokens: drawLength(o.outputTokens, rand),
      sampling: { temperature: 0.8, topK: 0, topP: 0.95, minP: 0, seed: o.seed * 7919 + i },
    };
  });
}

function policyResult(
  recs: readonly GenRecord[],
  t0: number,
  rows: number,
  padding: number,
): PolicyResult {
  const end = Math.max(...recs.map((r) => r.end ?? 0));
  const outputTokens = recs.reduce((s, r) => s + r.tokens.length, 0);
  const wallSeconds = (end - t0) / 1000;
  return {
    wallSeconds,
    outputTokens,
    outputTokensPerSecond: outputTokens / wallSeconds,
    ttftMs: summarize(recs.map((r) => r.firstToken! - r.arrival)),
    e2eMs: summarize(recs.map((r) => r.end! - r.arrival)),
    computedRows: rows,
    paddingRows: padding,
  };
}

/** The trace through the serving core (continuous batching, chunked prefill, paged KV). */
export async function runContinuous(
  bm: BenchModel,
  trace: readonly TraceItem[],
  o: BatchingOptions,
) {
  const maxLen = Math.max(...trace.map((t) => t.prompt.length + t.maxTokens));
  const blockSize = 16;
  const numBlocks = o.batchSize * Math.ceil(maxLen / blockSize) * 2;
  const { core, probe } = await makeCore(bm, o.backend, { numBlocks, blockSize }, {
    maxRunning: o.batchSize,
    maxBatchTokens: o.maxBatchTokens,
    maxWaiting: trace.length,
    // Static batches share no KV: with the prefix cache (which reuses down to a shared first
    // token) the continuous side would compute fewer rows for another reason than batching.
    prefixCaching: false,
  });
  const t0 = performance.now();
  const recs = await Promise.all(trace.map(async (t) => {
    await sleep(t0 + t.at - performance.now());
    return await timedGeneration(
      core,
      { prompt: t.prompt, maxTokens: t.maxTokens, sampling: t.sampling },
      undefined,
      t0 + t.at,
    );
  }));
  await core.close();
  const c = probe.counters;
  return { result: policyResult(recs, t0, c.prefillRows + c.decodeRows, 0), records: recs };
}

/** The trace through static batches driven on the engine directly (see the module comment). */
export async function runStatic(
  bm: BenchModel,
  trace: readonly TraceItem[],
  o: BatchingOptions,
  startClock: () => ReplayClock = wallClock,
) {
  const B = o.batchSize, blockSize = 16;
  const maxPrompt = Math.max(...trace.map((t) => t.prompt.length));
  const maxOut = Math.max(...trace.map((t) => t.maxTokens));
  const perSeq = Math.ceil((maxPrompt + maxOut) / blockSize);
  // Each member and its padding row get their own contiguous block range.
  const { engine } = await createEngine(bm.model, o.backend, {
    numBlocks: 2 * B * perSeq,
    blockSize,
  }, {
    maxBatchTokens: Math.max(o.maxBatchTokens, B),
    maxSeqs: 2 * B,
  });
  const table = (slot: number) => Array.from({ length: perSeq }, (_, i) => slot * perSeq + i);
  const recs: GenRecord[] = trace.map(() => ({ arrival: 0, tokens: [], cachedTokens: 0 }));
  let rows = 0, padding = 0, next = 0, stepId = 0, seqIds = 1;
  trace.forEach((t, i) => (recs[i] = { arrival: t.at, tokens: [], cachedTokens: 0 }));
  const clock = startClock(); // once the engine is built: the replay starts now
  const step = async (plan: StepPlan) => {
    const res = await engine.step(plan);
    clock.stepped();
    return res;
  };
  while (next < trace.length) {
    await clock.until(trace[next]!.at);
    const arrived = clock.now();
    const members: number[] = [];
    while (next < trace.length && members.length < B && trace[next]!.at <= arrived) {
      members.push(next++);
    }
    const longestPrompt = Math.max(...members.map((i) => trace[i]!.prompt.length));
    const longestOut = Math.max(...members.map((i) => trace[i]!.maxTokens));
    const ids = members.map(() => seqIds++);
    const padIds = members.map(() => seqIds++);
    // Prefill: every prompt plus its padding up to the longest prompt, in steps of at most
    // maxBatchTokens rows (an engine's step limit).
    const rowsOf: SeqInput[] = [];
    members.forEach((m, j) => {
      const t = trace[m]!;
      rowsOf.push({
        seqId: ids[j]!,
        tokens: t.prompt,
        startPos: 0,
        blockTable: table(2 * j),
        sample: true,
        sampling: t.sampling,
      });
      const pad = longestPrompt - t.prompt.length;
      if (pad > 0) {
        rowsOf.push({
          seqId: padIds[j]!,
          tokens: new Array(pad).fill(0),
          startPos: 0,
          blockTable: table(2 * j + 1),
          sample: false,
          sampling: t.sampling,
        });
        padding += pad;
      }
    });
    for (const plan of chunkPlans(rowsOf, o.maxBatchTokens, () => stepId++)) {
      const res = await step(plan);
      rows += plan.seqs.reduce((s, e) => s + e.tokens.length, 0);
      const at = clock.now();
      for (const s of res.sampled) {
        const j = ids.indexOf(s.seqId);
        if (j < 0) continue;
        recs[members[j]!]!.tokens.push(s.token);
        recs[members[j]!]!.firstToken = at;
      }
    }
    // Decode: all members until the longest output is done; finished ones compute padding.
    for (let k = 1; k < longestOut; k++) {
      const plan: StepPlan = {
        stepId: stepId++,
        seqs: members.map((m, j) => ({
          seqId: ids[j]!,
          tokens: [],
          useLastSampled: true,
          startPos: trace[m]!.prompt.length + k - 1,
          blockTable: table(2 * j),
          sample: true,
          sampling: trace[m]!.sampling,
        })),
      };
      const res = await step(plan);
      rows += members.length;
      const at = clock.now();
      res.sampled.forEach((s, j) => {
        const m = members[j]!;
        const r = recs[m]!;
        if (r.tokens.length < trace[m]!.maxTokens) {
          r.tokens.push(s.token);
          if (r.tokens.length === trace[m]!.maxTokens) r.end = at;
        } else padding++;
      });
    }
    for (const [j, m] of members.entries()) {
      recs[m]!.end ??= clock.now(); // max_tokens 1: done at prefill
      engine.release?.(ids[j]!);
      engine.release?.(padIds[j]!);
    }
  }
  engine.dispose();
  return { result: policyResult(recs, 0, rows, padding), records: recs };
}

/** Splits prefill rows into plans of at most `budget` rows, sampling only at a prompt's end. */
function chunkPlans(rows: readonly SeqInput[], budget: number, nextId: () => number): StepPlan[] {
  const plans: StepPlan[] = [];
  let cur: SeqInput[] = [], room = budget;
  for (const r of rows) {
    let done = 0;
    while (done < r.tokens.length) {
      const n = Math.min(room, r.tokens.length - done);
      const last = done + n === r.tokens.length;
      cur.push({
        ...r,
        tokens: r.tokens.slice(done, done + n),
        startPos: r.startPos + done,
        sample: r.sample && last,
      });
      done += n;
      room -= n;
      if (room === 0) {
        plans.push({ stepId: nextId(), seqs: cur });
        cur = [];
        room = budget;
      }
    }
  }
  if (cur.length > 0) plans.push({ stepId: nextId(), seqs: cur });
  return plans;
}

export async function compareBatching(bm: BenchModel, o: BatchingOptions): Promise<BatchingResult> {
  const trace = batchingTrace(bm, o);
  const cont = await runContinuous(bm, trace, o);
  const step = o.logicalStepMs;
  const startClock = step === undefined ? wallClock : () => logicalClock(step);
  const stat = await runStatic(bm, trace, o, startClock);
  const sameTokens = cont.records.every((r, i) =>
    r.tokens.join() === stat.records[i]!.tokens.join()
  );
  const c = cont.result, s = stat.result;
  const rows = [
    [
      "output tokens/s",
      fmt(c.outputTokensPerSecond, 0),
      fmt(s.outputTokensPerSecond, 0),
      ratio(c.outputTokensPerSecond, s.outputTokensPerSecond),
    ],
    [
      "wall time (s)",
      fmt(c.wallSeconds, 2),
      fmt(s.wallSeconds, 2),
      ratio(c.wallSeconds, s.wallSeconds),
    ],
    [
      "TTFT p50 (ms)",
      fmt(c.ttftMs.p50, 0),
      fmt(s.ttftMs.p50, 0),
      ratio(c.ttftMs.p50, s.ttftMs.p50),
    ],
    [
      "TTFT p99 (ms)",
      fmt(c.ttftMs.p99, 0),
      fmt(s.ttftMs.p99, 0),
      ratio(c.ttftMs.p99, s.ttftMs.p99),
    ],
    ["e2e p50 (ms)", fmt(c.e2eMs.p50, 0), fmt(s.e2eMs.p50, 0), ratio(c.e2eMs.p50, s.e2eMs.p50)],
    ["e2e p99 (ms)", fmt(c.e2eMs.p99, 0), fmt(s.e2eMs.p99, 0), ratio(c.e2eMs.p99, s.e2eMs.p99)],
    [
      "token rows computed",
      String(c.computedRows),
      String(s.computedRows),
      ratio(c.computedRows, s.computedRows),
    ],
    [
      "padding share of rows",
      pct(c.paddingRows / c.computedRows),
      pct(s.paddingRows / s.computedRows),
      "–",
    ],
  ];
  const markdown = [
    "### Continuous vs static batching",
    "",
    `${o.requests} requests, Poisson arrivals at ${o.ratePerSecond}/s, prompts ${o.promptTokens.min}–${o.promptTokens.max} tokens, ` +
    `outputs ${o.outputTokens.min}–${o.outputTokens.max} tokens (EOS ignored), batch cap ${o.batchSize}, ${o.backend} engine. ` +
    `Both produced ${c.outputTokens} output tokens; token for token the same: ${
      sameTokens ? "yes" : "NO"
    }. Static batching ran on the ${startClock().label}.`,
    "",
    table(["", "continuous", "static", "continuous / static"], rows),
  ].join("\n");
  return { options: o, continuous: c, static: s, sameTokens, markdown };
}
