/**
 * Interactive time to first token with and without a batch job running: the real server
 * (main.ts serve) is started once per `--batch-concurrency` level; 8 closed-loop streaming
 * clients (with think time) send interactive completions alone, then while a large batch
 * (POST /v1/files, POST /v1/batches) runs beside them, in alternating rounds (a fresh batch
 * each round, cancelled at its end). Prints p50/p99 TTFT alone and beside the batch, their ratio, and the
 * batch lines finished per second meanwhile.
 *
 *   deno run -A bench/batch_bench.ts --concurrency 1,2,4,8 --backend cpu
 *   deno run -A bench/batch_bench.ts --quick
 */
import { parseArgs } from "@std/cli/parse-args";
import { httpGenerate, type RequestRecord } from "./load_clients.ts";
import { machineInfo, machineLine } from "./machine.ts";
import { modelMirror, startServer } from "../tests/harness/server_process.ts";
import { fmt, ratio, summarize, type Summary, table } from "./stats.ts";
import { seededRandom, storyWords } from "./workload.ts";

export interface BatchBenchOptions {
  /** `--batch-concurrency` levels, one server each. */
  readonly levels: readonly number[];
  readonly backend: string;
  /** Closed-loop interactive streaming clients. */
  readonly clients: number;
  /** Requests each client sends per phase. */
  readonly requestsPerClient: number;
  /** Mean pause of a client between its requests (exponential), so capacity is left idle. */
  readonly thinkMs: number;
  /** Alone / beside-a-batch rounds per level. */
  readonly rounds: number;
  readonly interactiveMaxTokens: number;
  readonly batchLines: number;
  readonly batchMaxTokens: number;
  readonly log?: (line: string) => void;
}

export interface BatchBenchRow {
  readonly batchConcurrency: number;
  readonly alone: Summary;
  readonly withBatch: Summary;
  /** Batch lines finished per second while the interactive clients ran beside them. */
  readonly batchLinesPerSecond: number;
  readonly errors: number;
}

async function interactivePhase(
  base: string,
  o: BatchBenchOptions,
  seed: number,
): Promise<RequestRecord[]> {
  const out: RequestRecord[] = [];
  const client = async (k: number) => {
    const rand = seededRandom(seed + k);
    for (let i = 0; i < o.requestsPerClient; i++) {
      if (o.thinkMs > 0) {
        await new Promise((r) => setTimeout(r, -Math.log(1 - rand()) * o.thinkMs));
      }
      out.push(
        await httpGenerate(base, k * 1000 + i, {
          prompt: storyWords(12, rand),
          maxTokens: o.interactiveMaxTokens,
        }, { temperature: 0, seed: 1, priority: "interactive" }),
      );
    }
  };
  await Promise.all(Array.from({ length: o.clients }, (_, k) => client(k)));
  return out;
}

async function json(res: Response): Promise<any> {
  const body = await res.json();
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${JSON.stringify(body)}`);
  return body;
}

async function startBatch(base: string, o: BatchBenchOptions): Promise<string> {
  const rand = seededRandom(99);
  const text = Array.from({ length: o.batchLines }, (_, i) =>
    JSON.stringify({
      custom_id: `b${i}`,
      method: "POST",
      url: "/v1/completions",
      body: { prompt: storyWords(12, rand), max_tokens: o.batchMaxTokens, temperature: 0.8 },
    })).join("\n");
  const form = new FormData();
  form.append("purpose", "batch");
  form.append("file", new Blob([text]), "bench.jsonl");
  const file = await json(await fetch(`${base}/v1/files`, { method: "POST", body: form }));
  const batch = await json(
    await fetch(`${base}/v1/batches`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        input_file_id: file.id,
        endpoint: "/v1/completions",
        completion_window: "24h",
      }),
    }),
  );
  return batch.id;
}

async function batchDone(base: string, id: string): Promise<{ done: number; status: string }> {
  const b = await json(await fetch(`${base}/v1/batches/${id}`));
  return { done: b.request_counts.completed + b.request_counts.failed, status: b.status };
}

const ttfts = (rs: readonly RequestRecord[]) =>
  summarize(rs.filter((r) => r.ttftMs !== undefined).map((r) => r.ttftMs!));

export async function runBatchBench(o: BatchBenchOptions): Promise<BatchBenchRow[]> {
  const rows: BatchBenchRow[] = [];
  for (const level of o.levels) {
    const dataDir = await Deno.makeTempDir({ prefix: "batch_bench_" });
    const srv = await startServer({
      args: [
        "--model",
        `${modelMirror()}/stories260K.bin`,
        "--tokenizer",
        `${modelMirror()}/tok512.bin`,
        "--backend",
        o.backend,
        "--log-format",
        "off",
        "--data-dir",
        dataDir,
        "--batch-concurrency",
        String(level),
      ],
    });
    try {
      // Warm-up, as long as a measured phase and not measured: the first requests pay for
      // compilation and first touches of the KV pages.
      await interactivePhase(srv.base, o, 7);
      // Rounds of alone / beside a fresh batch, so the machine's drift (other processes on
      // shared cores) falls on both sides alike.
      const alone: RequestRecord[] = [];
      const beside: RequestRecord[] = [];
      let lines = 0, seconds = 0;
      for (let round = 0; round < o.rounds; round++) {
        alone.push(...await interactivePhase(srv.base, o, 1 + round));
        const id = await startBatch(srv.base, o);
        // Let the batch reach its steady state before measuring beside it.
        while ((await batchDone(srv.base, id)).done < level) {
          await new Promise((r) => setTimeout(r, 20));
        }
        const before = await batchDone(srv.base, id);
        const t0 = performance.now();
        beside.push(...await interactivePhase(srv.base, o, 1 + round));
        seconds += (performance.now() - t0) / 1000;
        const after = await batchDone(srv.base, id);
        lines += after.done - before.done;
        if (after.status !== "in_progress") {
          o.log?.(`warning: the batch ended (${after.status}) before the interactive phase did`);
        }
        await fetch(`${srv.base}/v1/batches/${id}/cancel`, { method: "POST" }).then((r) =>
          r.body?.cancel()
        );
        while ((await batchDone(srv.base, id)).status !== "cancelled") {
          await new Promise((r) => setTimeout(r, 20));
        }
      }
      const row: BatchBenchRow = {
        batchConcurrency: level,
        alone: ttfts(alone),
        withBatch: ttfts(beside),
        batchLinesPerSecond: lines / seconds,
        errors: [...alone, ...beside].filter((r) => r.error !== undefined).length,
      };
      o.log?.(
        `batch concurrency ${level}: p50 ${fmt(row.alone.p50)} -> ${fmt(row.withBatch.p50)} ms, ` +
          `p99 ${fmt(row.alone.p99)} -> ${fmt(row.withBatch.p99)} ms`,
      );
      rows.push(row);
    } finally {
      await srv.stop();
      await Deno.remove(dataDir, { recursive: true });
    }
  }
  return rows;
}

export function batchBenchTable(rows: readonly BatchBenchRow[]): string {
  return table(
    [
      "batch lines at once",
      "TTFT p50 alone (ms)",
      "p50 beside batch",
      "p50 ratio",
      "TTFT p99 alone (ms)",
      "p99 beside batch",
      "p99 ratio",
      "batch lines/s",
      "errors",
    ],
    rows.map((r) => [
      String(r.batchConcurrency),
      fmt(r.alone.p50),
      fmt(r.withBatch.p50),
      ratio(r.withBatch.p50, r.alone.p50),
      fmt(r.alone.p99),
      fmt(r.withBatch.p99),
      ratio(r.withBatch.p99, r.alone.p99),
      fmt(r.batchLinesPerSecond, 2),
      String(r.errors),
    ]),
  );
}

if (import.meta.main) {
  const args = parseArgs(Deno.args, {
    string: ["concurrency", "backend", "clients", "requests", "think-ms", "rounds"],
    boolean: ["quick"],
  });
  const quick = args.quick === true;
  const o: BatchBenchOptions = {
    levels: (args.concurrency ?? (quick ? "2" : "1,2,4,8")).split(",").map(Number),
    backend: args.backend ?? "cpu",
    clients: Number(args.clients ?? 8),
    requestsPerClient: Number(args.requests ?? (quick ? 3 : 12)),
    thinkMs: Number(args["think-ms"] ?? 100),
    rounds: Number(args.rounds ?? (quick ? 1 : 3)),
    interactiveMaxTokens: 16,
    batchLines: quick ? 200 : 5000,
    batchMaxTokens: 64,
    log: (l) => console.error(l),
  };
  console.log(machineLine(machineInfo()));
  console.log(
    `stories260K, --backend ${o.backend}; ${o.clients} interactive streaming clients (closed loop, ` +
      `${o.requestsPerClient} requests each per phase, ${o.thinkMs} ms mean think time, 12-word prompts, ` +
      `${o.interactiveMaxTokens} tokens, greedy; ${o.rounds} rounds of alone / beside a batch); ` +
      `batch lines: 12-word prompts, ${o.batchMaxTokens} tokens, temperature 0.8`,
  );
  console.log(batchBenchTable(await runBatchBench(o)));
}
