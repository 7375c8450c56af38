/**
 * Load generator: N concurrent clients (closed loop) or Poisson arrivals at a rate (open
 * loop), over the WebSocket protocol or the OpenAI streaming HTTP API, against a server it
 * starts itself (one per backend) or one at --url. Reports output tokens/s, requests/s, time to
 * first token, inter-token latency and end-to-end latency (p50/p90/p99) and errors by code: a
 * markdown table on stdout, JSON and an SVG chart in --out.
 *
 *   deno run -A bench/load.ts --concurrency 1,8,32,64 --backend cpu,webgpu
 *   deno run -A bench/load.ts --url http://127.0.0.1:8000 --rate 2,4,8 --api http
 *   deno run -A bench/load.ts --prompts requests.jsonl --concurrency 16
 */
import { parseArgs } from "@std/cli/parse-args";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import {
  httpGenerate,
  type RequestRecord,
  type SamplingSpec,
  WsConnection,
  WsPool,
} from "./load_clients.ts";
import { type MachineInfo, machineInfo, machineLine } from "./machine.ts";
import { modelMirror, type ServerProcess, startServer } from "../tests/harness/server_process.ts";
import { fmt, summarize, type Summary, table } from "./stats.ts";
import { chartSvg, type Panel } from "./svg_chart.ts";
import {
  type LengthDist,
  parseJsonlWorkload,
  parseLengthDist,
  poissonArrivals,
  seededRandom,
  syntheticWorkload,
  type TokenCounter,
  type WorkItem,
} from "./workload.ts";

export type Api = "ws" | "http";

export interface LoadOptions {
  /** A running server; when absent one server per backend is started. */
  readonly url?: string;
  readonly backends: readonly string[];
  /** Model file for the started servers (and prompt token counting). */
  readonly model?: string;
  readonly apis: readonly Api[];
  /** Closed-loop concurrency levels (used when `rates` is empty). */
  readonly concurrency: readonly number[];
  /** Open-loop arrival rates in requests/s. */
  readonly rates: readonly number[];
  /** Requests per level; default max(16, 4 × concurrency) closed, 64 open. */
  readonly requests?: number;
  readonly promptTokens: LengthDist;
  readonly outputTokens: LengthDist;
  /** A JSONL request file replacing the synthetic prompts. */
  readonly promptsFile?: string;
  readonly temperature: number;
  readonly seed: number;
  /** Requests sent (one at a time, not measured) before each server's first level. */
  readonly warmup: number;
  /** Extra `serve` flags for the started servers. */
  readonly serverArgs: readonly string[];
  readonly apiKey?: string;
  /** Directory for load.json and load.svg; null writes nothing. */
  readonly outDir: string | null;
  readonly log?: (line: string) => void;
}

export interface LevelResult {
  /** Concurrency (closed loop) or rate in requests/s (open loop). */
  readonly level: number;
  readonly requests: number;
  readonly completed: number;
  readonly errors: Record<string, number>;
  readonly wallSeconds: number;
  readonly outputTokens: number;
  readonly outputTokensPerSecond: number;
  readonly requestsPerSecond: number;
  readonly promptTokensMean: number;
  readonly outputTokensMean: number;
  readonly ttftMs: Summary;
  readonly itlMs: Summary;
  readonly e2eMs: Summary;
}

export interface RunResult {
  readonly backend: string;
  readonly api: Api;
  readonly mode: "closed" | "open";
  /** The server's own description of its engine (start-up line), or why it could not start. */
  readonly engine: string;
  readonly levels: readonly LevelResult[];
  readonly unavailable?: string;
}

export interface LoadReport {
  readonly date: string;
  readonly machine: MachineInfo;
  readonly command: string;
  readonly options: Omit<LoadOptions, "log">;
  readonly runs: readonly RunResult[];
  readonly markdown: string;
  readonly files: string[];
}

/** Turns one level's request records into its figures. */
export function summarizeLevel(
  level: number,
  records: readonly RequestRecord[],
  wallMs: number,
): LevelResult {
  const ok = records.filter((r) => r.error === undefined);
  const errors: Record<string, number> = {};
  for (const r of records) if (r.error !== undefined) errors[r.error] = (errors[r.error] ?? 0) + 1;
  const outputTokens = ok.reduce((s, r) => s + r.outputTokens, 0);
  const wallSeconds = wallMs / 1000;
  return {
    level,
    requests: records.length,
    completed: ok.length,
    errors,
    wallSeconds,
    outputTokens,
    outputTokensPerSecond: outputTokens / wallSeconds,
    requestsPerSecond: ok.length / wallSeconds,
    promptTokensMean: ok.length ? ok.reduce((s, r) => s + r.promptTokens, 0) / ok.length : NaN,
    outputTokensMean: ok.length ? outputTokens / ok.length : NaN,
    ttftMs: summarize(ok.flatMap((r) => (r.ttftMs === undefined ? [] : [r.ttftMs]))),
    itlMs: summarize(ok.flatMap((r) => r.itlMs)),
    e2eMs: summarize(ok.map((r) => r.e2eMs!)),
  };
}

type Generate = (index: number, item: WorkItem, s: SamplingSpec) => Promise<RequestRecord>;

function sampling(opts: LoadOptions, index: number): SamplingSpec {
  return { temperature: opts.temperature, seed: opts.seed * 1_000_003 + index };
}

/** Closed loop: `concurrency` clients, each sending its next request when the last is done. */
async function closedLoop(
  server: { base: string; wsUrl: string },
  api: Api,
  items: readonly WorkItem[],
  concurrency: number,
  opts: LoadOptions,
): Promise<LevelResult> {
  const headers: Record<string, string> = opts.apiKey
    ? { authorization: `Bearer ${opts.apiKey}` }
    : {};
  const wsUrl = opts.apiKey
    ? `${server.wsUrl}?api_key=${encodeURIComponent(opts.apiKey)}`
    : server.wsUrl;
  const conns = api === "ws"
    ? await Promise.all(Array.from({ length: concurrency }, () => WsConnection.open(wsUrl)))
    : [];
  const records: RequestRecord[] = [];
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async (_, c) => {
    const gen: Generate = api === "ws"
      ? (i, item, s) => conns[c]!.generate(i, item, s)
      : (i, item, s) => httpGenerate(server.base, i, item, s, headers);
    for (let i = next++; i < items.length; i = next++) {
      records.push(await gen(i, items[i]!, sampling(opts, i)));
    }
  }));
  const wall = performance.now() - t0;
  for (const c of conns) c.close();
  return summarizeLevel(concurrency, records, wall);
}

/** Open loop: requests arrive at Poisson times at `rate` per second, whatever the server does. */
async function openLoop(
  server: { base: string; wsUrl: string },
  api: Api,
  items: readonly WorkItem[],
  rate: number,
  opts: LoadOptions,
): Promise<LevelResult> {
  const headers: Record<string, string> = opts.apiKey
    ? { authorization: `Bearer ${opts.apiKey}` }
    : {};
  const wsUrl = opts.apiKey
    ? `${server.wsUrl}?api_key=${encodeURIComponent(opts.apiKey)}`
    : server.wsUrl;
  const pool = new WsPool(wsUrl);
  const arrivals = poissonArrivals(items.length, rate, seededRandom(opts.seed ^ 0x5bd1e995));
  const t0 = performance.now();
  const records = await Promise.all(items.map(async (item, i) => {
    const wait = t0 + arrivals[i]! - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    return api === "ws"
      ? await pool.generate(i, item, sampling(opts, i))
      : await httpGenerate(server.base, i, item, sampling(opts, i), headers);
  }));
  const wall = performance.now() - t0;
  pool.close();
  return summarizeLevel(rate, records, wall);
}

function counterFor(modelPath: string | undefined): Promise<TokenCounter | undefined> {
  if (!modelPath) return Promise.resolve(undefined);
  return loadModel(modelPath).then((m) => {
    if (!m.tokenizer) return undefined;
    const tok = new Tokenizer(m.tokenizer);
    return (text: string) => tok.encode(text, { bos: true }).length;
  }, () => undefined);
}

async function workloadFor(
  opts: LoadOptions,
  count: number,
  counter: TokenCounter | undefined,
): Promise<WorkItem[]> {
  if (opts.promptsFile) {
    const all = parseJsonlWorkload(
      await Deno.readTextFile(opts.promptsFile),
      opts.promptsFile,
      opts.outputTokens.max,
    );
    // Cycle through the file when a level needs more requests than it has.
    return Array.from({ length: count }, (_, i) => all[i % all.length]!);
  }
  return syntheticWorkload({
    count,
    promptTokens: opts.promptTokens,
    outputTokens: opts.outputTokens,
    seed: opts.seed,
    countTokens: counter,
  });
}

function engineLine(log: string): string {
  return /backend\s+(.+)/.exec(log)?.[1]?.trim() ?? "unknown";
}

/** Runs every (backend, api) over every level and writes the report. */
export async function runLoad(opts: LoadOptions): Promise<LoadReport> {
  const log = opts.log ?? ((l: string) => console.error(l));
  const mode = opts.rates.length > 0 ? "open" : "closed";
  const levels = mode === "open" ? opts.rates : opts.concurrency;
  const counter = await counterFor(opts.model);
  const runs: RunResult[] = [];
  const backends = opts.url ? ["(external)"] : opts.backends;
  for (const backend of backends) {
    let server: ServerProcess | undefined;
    let target: { base: string; wsUrl: string };
    let engine = "external server";
    if (opts.url) {
      const base = opts.url.replace(/\/$/, "");
      target = { base, wsUrl: `${base.replace(/^http/, "ws")}/v1/stream` };
    } else {
      try {
        log(`starting the server with --backend ${backend}`);
        server = await startServer({
          args: [
            ...(opts.model ? ["--model", opts.model] : []),
            "--backend",
            backend,
            ...opts.serverArgs,
          ],
        });
        target = server;
        engine = engineLine(server.log());
      } catch (e) {
        const why = (e as Error).message.split("\n").filter((l) =>
          /error|cannot|fail/i.test(l)
        ).slice(0, 3).join(" / ") ||
          (e as Error).message.slice(0, 300);
        log(`backend ${backend} unavailable: ${why}`);
        for (const api of opts.apis) {
          runs.push({ backend, api, mode, engine: "unavailable", levels: [], unavailable: why });
        }
        continue;
      }
    }
    try {
      for (const api of opts.apis) {
        const warm = await workloadFor(
          { ...opts, outputTokens: { min: 8, max: 8 } },
          opts.warmup,
          counter,
        );
        for (const [i, item] of warm.entries()) {
          await (api === "ws"
            ? WsConnection.open(target.wsUrl).then(async (c) => {
              await c.generate(i, item, sampling(opts, i));
              c.close();
            })
            : httpGenerate(target.base, i, item, sampling(opts, i)));
        }
        const results: LevelResult[] = [];
        for (const level of levels) {
          const count = opts.requests ?? (mode === "open" ? 64 : Math.max(16, 4 * level));
          const items = await workloadFor(opts, count, counter);
          log(
            `${backend}/${api}: ${
              mode === "open" ? `${level} req/s` : `concurrency ${level}`
            }, ${count} requests`,
          );
          const r = mode === "open"
            ? await openLoop(target, api, items, level, opts)
            : await closedLoop(target, api, items, level, opts);
          log(
            `  ${fmt(r.outputTokensPerSecond, 0)} tok/s, p99 e2e ${
              fmt(r.e2eMs.p99, 0)
            } ms, errors ${JSON.stringify(r.errors)}`,
          );
          results.push(r);
        }
        runs.push({ backend, api, mode, engine, levels: results });
      }
    } finally {
      if (server) {
        const { code } = await server.stop("SIGTERM");
        if (code !== 0) log(`warning: the ${backend} server exited with code ${code}`);
      }
    }
  }
  const machine = machineInfo();
  const date = new Date().toISOString();
  const command = `deno run -A bench/load.ts ${Deno.args.join(" ")}`.trim();
  const markdown = renderLoadMarkdown(runs, mode, { date, machine, command });
  const files: string[] = [];
  const report: LoadReport = {
    date,
    machine,
    command,
    options: stripLog(opts),
    runs,
    markdown,
    files,
  };
  if (opts.outDir !== null) {
    await Deno.mkdir(opts.outDir, { recursive: true });
    const json = `${opts.outDir}/load.json`, svg = `${opts.outDir}/load.svg`;
    await Deno.writeTextFile(
      json,
      JSON.stringify(
        report,
        (_k, v) => (Number.isFinite(v) || typeof v !== "number" ? v : null),
        2,
      ),
    );
    await Deno.writeTextFile(svg, loadChart(runs, mode));
    files.push(json, svg);
  }
  return report;
}

function stripLog(opts: LoadOptions): Omit<LoadOptions, "log"> {
  const { log: _log, ...rest } = opts;
  return rest;
}

/** The markdown report: one table row per (backend, api, level). */
export function renderLoadMarkdown(
  runs: readonly RunResult[],
  mode: "closed" | "open",
  meta: { date: string; machine: MachineInfo; command: string },
): string {
  const head = [
    "backend",
    "api",
    mode === "open" ? "req/s in" : "conc.",
    "reqs",
    "ok",
    "errors",
    "out tok/s",
    "req/s",
    "prompt tok",
    "out tok",
    "TTFT p50",
    "TTFT p90",
    "TTFT p99",
    "ITL p50",
    "ITL p90",
    "ITL p99",
    "e2e p50",
    "e2e p90",
    "e2e p99",
  ];
  const rows: string[][] = [];
  const notes: string[] = [];
  for (const run of runs) {
    if (run.unavailable) {
      notes.push(`- ${run.backend}/${run.api}: not measured: ${run.unavailable}`);
      continue;
    }
    for (const l of run.levels) {
      const errs = Object.entries(l.errors).map(([c, n]) => `${c}:${n}`).join(" ") || "0";
      rows.push([
        run.backend,
        run.api,
        String(l.level),
        String(l.requests),
        String(l.completed),
        errs,
        fmt(l.outputTokensPerSecond, 0),
        fmt(l.requestsPerSecond, 2),
        fmt(l.promptTokensMean, 0),
        fmt(l.outputTokensMean, 0),
        fmt(l.ttftMs.p50),
        fmt(l.ttftMs.p90),
        fmt(l.ttftMs.p99),
        fmt(l.itlMs.p50),
        fmt(l.itlMs.p90),
        fmt(l.itlMs.p99),
        fmt(l.e2eMs.p50, 0),
        fmt(l.e2eMs.p90, 0),
        fmt(l.e2eMs.p99, 0),
      ]);
    }
  }
  const engines = runs.filter((r) => !r.unavailable).map((r) => `- ${r.backend}: ${r.engine}`);
  return [
    `### Load (${
      mode === "open" ? "open loop, Poisson arrivals" : "closed loop"
    }); latencies in ms`,
    "",
    `${meta.date}, ${machineLine(meta.machine)}`,
    "",
    `\`${meta.command}\``,
    "",
    table(head, rows),
    ...[...new Set(engines)],
    ...notes,
    "",
  ].join("\n");
}

/** Throughput and p99 latency against the level, one series per (backend, api). */
export function loadChart(runs: readonly RunResult[], mode: "closed" | "open"): string {
  const measured = runs.filter((r) => !r.unavailable && r.levels.length > 0);
  const x = [...new Set(measured.flatMap((r) => r.levels.map((l) => l.level)))].sort((a, b) =>
    a - b
  );
  const xLabel = mode === "open" ? "arrival rate (requests/s)" : "concurrent clients";
  const at = (r: RunResult, f: (l: LevelResult) => number) =>
    x.map((v) => {
      const l = r.levels.find((l) => l.level === v);
      return l ? f(l) : null;
    });
  const name = (r: RunResult) => `${r.backend}/${r.api}`;
  const panels: Panel[] = [
    {
      title: "Throughput",
      xLabel,
      yLabel: "output tokens/s",
      x,
      series: measured.map((r) => ({
        name: name(r),
        values: at(r, (l) => l.outputTokensPerSecond),
      })),
    },
    {
      title: "p99 latency",
      xLabel,
      yLabel: "milliseconds",
      x,
      series: measured.flatMap((r) => [
        { name: `${name(r)} e2e`, values: at(r, (l) => l.e2eMs.p99) },
        { name: `${name(r)} TTFT`, values: at(r, (l) => l.ttftMs.p99), dashed: true },
      ]),
    },
  ];
  return chartSvg(panels, `llmserve load benchmark, ${new Date().toISOString().slice(0, 10)}`);
}

const numbers = (s: string, flag: string) =>
  s.split(",").filter((v) => v.trim() !== "").map((v) => {
    const n = Number(v);
    if (!(n > 0)) {
      throw new Error(
        `Invalid --${flag}: expected positive numbers separated by commas, received ${
          JSON.stringify(s)
        }`,
      );
    }
    return n;
  });

/** Parses the command line into LoadOptions. */
export function parseLoadArgs(argv: string[]): LoadOptions {
  // "--server-arg --max-running 64": parseArgs takes a value that starts with "-" for a flag of
  // its own, so the server's flags were dropped without a word. Bind each to its --server-arg.
  const bound: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === "--server-arg" && i + 1 < argv.length) bound.push(`--server-arg=${argv[++i]}`);
    else bound.push(a);
  }
  const f = parseArgs(bound, {
    string: [
      "url",
      "backend",
      "model",
      "api",
      "concurrency",
      "rate",
      "requests",
      "prompt-tokens",
      "output-tokens",
      "prompts",
      "temperature",
      "seed",
      "warmup",
      "out",
      "server-arg",
      "api-key",
    ],
    collect: ["server-arg"],
    boolean: ["help", "no-out"],
    unknown: (arg: string) => {
      throw new Error(`Unknown argument ${JSON.stringify(arg)} for bench/load.ts; see --help`);
    },
  });
  if (f.help) {
    console.log(USAGE);
    Deno.exit(0);
  }
  const apis = (f.api ?? "ws").split(",") as Api[];
  for (const a of apis) {
    if (a !== "ws" && a !== "http") {
      throw new Error(
        `Invalid --api: expected ws, http or ws,http; received ${JSON.stringify(f.api)}`,
      );
    }
  }
  const serverArgs = (f["server-arg"] as string[] | undefined ?? []).flatMap((a) =>
    a.split(" ").filter(Boolean)
  );
  let model = f.model;
  if (!model && !f.url) model = `${modelMirror()}/stories260K-ctx512.gguf`;
  return {
    url: f.url,
    backends: (f.backend ?? "cpu,webgpu").split(","),
    model,
    apis,
    concurrency: numbers(f.concurrency ?? "1,8,32,64", "concurrency").map(Math.round),
    rates: f.rate ? numbers(f.rate, "rate") : [],
    requests: f.requests ? numbers(f.requests, "requests")[0] : undefined,
    promptTokens: parseLengthDist(f["prompt-tokens"] ?? "16-64", "prompt-tokens"),
    outputTokens: parseLengthDist(f["output-tokens"] ?? "128", "output-tokens"),
    promptsFile: f.prompts,
    temperature: Number(f.temperature ?? "0.8"),
    seed: Number(f.seed ?? "1"),
    warmup: Number(f.warmup ?? "2"),
    serverArgs,
    apiKey: f["api-key"],
    outDir: f["no-out"] ? null : f.out ?? new URL("./out", import.meta.url).pathname,
  };
}

const USAGE = `Usage: deno task bench:load [options]
  --url URL              benchmark a running server (default: start one per --backend)
  --backend LIST         backends to start, e.g. cpu,webgpu (default cpu,webgpu; one that
                         cannot start is reported as unavailable)
  --model PATH           model for the started servers (default $MODEL_MIRROR/stories260K-ctx512.gguf)
  --server-arg "FLAGS"   extra serve flags, e.g. "--max-running 64" (repeatable)
  --api ws|http|ws,http  WebSocket protocol or OpenAI streaming HTTP (default ws)
  --concurrency LIST     closed-loop client counts (default 1,8,32,64)
  --rate LIST            open loop instead: Poisson arrival rates in requests/s
  --requests N           requests per level (default max(16, 4 x concurrency); 64 open loop)
  --prompt-tokens A-B    prompt length in tokens, fixed N or uniform A-B (default 16-64)
  --output-tokens A-B    max_tokens, fixed N or uniform A-B (default 128)
  --prompts FILE.jsonl   requests from a file: {"prompt"|"messages", "max_tokens"?} per line
  --temperature T        (default 0.8)   --seed N (default 1)   --warmup N (default 2)
  --api-key KEY          sent as Authorization: Bearer (and ?api_key= on the socket)
  --out DIR              where load.json and load.svg go (default bench/out); --no-out: none`;

if (import.meta.main) {
  const report = await runLoad(parseLoadArgs(Deno.args));
  console.log(report.markdown);
  for (const f of report.files) console.error(`wrote ${f}`);
}
