/**
 * The result cache on a repeated-request workload: the same server (real model, real
 * process) run with `--result-cache 0` and with a cache, fed the same closed-loop workload of
 * a few distinct greedy prompts asked again and again. Prints TTFT, end-to-end latency and
 * throughput for both, with the ratio, and checks every answer is the same token for token.
 *
 *   MODEL_MIRROR=../shared/models deno task bench:result-cache [--prompts 8] [--repeats 8]
 *     [--concurrency 4] [--tokens 64] [--backend auto]
 */
import { parseArgs } from "@std/cli/parse-args";
import { type RequestRecord, WsPool } from "./load_clients.ts";
import { machineInfo, machineLine } from "./machine.ts";
import { startServer } from "../tests/harness/server_process.ts";
import { fmt, ratio, summarize, table } from "./stats.ts";
import type { WorkItem } from "./workload.ts";

export interface CacheBenchOptions {
  readonly prompts: number;
  readonly repeats: number;
  readonly concurrency: number;
  readonly tokens: number;
  readonly backend: string;
  readonly cacheBytes: string;
}

export interface CacheRun {
  readonly mode: string;
  readonly records: RequestRecord[];
  readonly wallMs: number;
  readonly hits: number;
  readonly misses: number;
}

const STORY_STARTS = [
  "Once upon a time",
  "The little dog",
  "Lily and Tom went to the park",
  "One day, a big red ball",
  "The sun was shining and",
  "Tim had a toy car",
  "In a small house there lived",
  "Sara wanted to play with",
  "The cat sat on the mat",
  "Ben found a shiny stone",
  "Mom said it was time to",
  "A bird flew over the tree",
];

/** `prompts` distinct prompts, each asked `repeats` times, interleaved (not back to back). */
export function repeatedWorkload(prompts: number, repeats: number, tokens: number): WorkItem[] {
  const items: WorkItem[] = [];
  for (let r = 0; r < repeats; r++) {
    for (let p = 0; p < prompts; p++) {
      const base = STORY_STARTS[p % STORY_STARTS.length]!;
      const prompt = p < STORY_STARTS.length ? base : `${base} (${p})`;
      items.push({ prompt, maxTokens: tokens });
    }
  }
  return items;
}

function metric(text: string, name: string): number {
  const line = text.split("\n").find((l) => l.startsWith(name + " "));
  return line === undefined ? 0 : Number(line.slice(name.length + 1));
}

async function runOnce(o: CacheBenchOptions, cache: string): Promise<CacheRun> {
  const server = await startServer({
    args: ["--backend", o.backend, "--result-cache", cache, "--log-format", "json"],
    env: { ...Deno.env.toObject() },
  });
  const pool = new WsPool(server.wsUrl);
  let run: CacheRun;
  try {
    run = await drive(o, cache, server.base, pool);
  } catch (e) {
    pool.close();
    await server.stop();
    throw e;
  }
  pool.close();
  const { code, log } = await server.stop();
  if (code !== 0) throw new Error(`server exited with ${code}:\n${log.slice(-2000)}`);
  return run;
}

async function drive(
  o: CacheBenchOptions,
  cache: string,
  base: string,
  pool: WsPool,
): Promise<CacheRun> {
  const items = repeatedWorkload(o.prompts, o.repeats, o.tokens);
  const records: RequestRecord[] = new Array(items.length);
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: o.concurrency }, async () => {
      for (let i = next++; i < items.length; i = next++) {
        records[i] = await pool.generate(i, items[i]!, { temperature: 0, seed: 0 });
      }
    }),
  );
  const wallMs = performance.now() - t0;
  const metrics = await (await fetch(`${base}/metrics`)).text();
  return {
    mode: cache === "0" ? "cache off" : `cache ${cache}`,
    records,
    wallMs,
    hits: metric(metrics, "llm_result_cache_hits_total"),
    misses: metric(metrics, "llm_result_cache_misses_total"),
  };
}

/** Both runs, off first; throws when any answer differs between them or a request failed. */
export async function runCacheBench(
  o: CacheBenchOptions,
): Promise<{ off: CacheRun; on: CacheRun }> {
  const off = await runOnce(o, "0");
  const on = await runOnce(o, o.cacheBytes);
  for (const run of [off, on]) {
    const failed = run.records.filter((r) => r.error !== undefined);
    if (failed.length > 0) {
      throw new Error(`${run.mode}: ${failed.length} requests failed (${failed[0]!.error})`);
    }
  }
  for (let i = 0; i < off.records.length; i++) {
    const a = off.records[i]!.tokenIds.join(","), b = on.records[i]!.tokenIds.join(",");
    if (a !== b) throw new Error(`request ${i}: the cached answer differs from the generated one`);
  }
  return { off, on };
}

export function cacheTable(off: CacheRun, on: CacheRun): string {
  const row = (r: CacheRun) => {
    const ttft = summarize(r.records.map((x) => x.ttftMs ?? NaN));
    const e2e = summarize(r.records.map((x) => x.e2eMs ?? NaN));
    const tokens = r.records.reduce((s, x) => s + x.outputTokens, 0);
    return {
      ttft,
      e2e,
      tps: tokens / (r.wallMs / 1000),
      rps: r.records.length / (r.wallMs / 1000),
      hitRate: r.hits + r.misses > 0 ? r.hits / (r.hits + r.misses) : 0,
    };
  };
  const a = row(off), b = row(on);
  return table(
    ["", "requests", "hits", "TTFT p50 ms", "TTFT p99 ms", "e2e p50 ms", "tokens/s", "requests/s"],
    [
      [
        off.mode,
        String(off.records.length),
        `${(a.hitRate * 100).toFixed(0)}%`,
        fmt(a.ttft.p50),
        fmt(a.ttft.p99),
        fmt(a.e2e.p50),
        fmt(a.tps, 0),
        fmt(a.rps),
      ],
      [
        on.mode,
        String(on.records.length),
        `${(b.hitRate * 100).toFixed(0)}%`,
        fmt(b.ttft.p50),
        fmt(b.ttft.p99),
        fmt(b.e2e.p50),
        fmt(b.tps, 0),
        fmt(b.rps),
      ],
      [
        "on / off",
        "",
        "",
        ratio(b.ttft.p50, a.ttft.p50),
        ratio(b.ttft.p99, a.ttft.p99),
        ratio(b.e2e.p50, a.e2e.p50),
        ratio(b.tps, a.tps),
        ratio(b.rps, a.rps),
      ],
    ],
  );
}

if (import.meta.main) {
  const f = parseArgs(Deno.args, {
    string: ["prompts", "repeats", "concurrency", "tokens", "backend", "cache"],
    default: {
      prompts: "8",
      repeats: "8",
      concurrency: "4",
      tokens: "64",
      backend: "auto",
      cache: "64MiB",
    },
  });
  const o: CacheBenchOptions = {
    prompts: Number(f.prompts),
    repeats: Number(f.repeats),
    concurrency: Number(f.concurrency),
    tokens: Number(f.tokens),
    backend: f.backend,
    cacheBytes: f.cache,
  };
  console.log(`# Result cache, ${new Date().toISOString()}\n`);
  console.log(machineLine(machineInfo()) + "\n");
  console.log(
    `stories260K, backend ${o.backend}, ${o.prompts} distinct greedy prompts x ${o.repeats} ` +
      `repeats, ${o.tokens} tokens each, closed loop at concurrency ${o.concurrency}, WebSocket\n`,
  );
  const { off, on } = await runCacheBench(o);
  console.log(cacheTable(off, on));
  console.log("Every answer was the same token for token with the cache on and off.");
}
