/**
 * The side-by-side comparisons, in one run, each a markdown table with ratios:
 * continuous vs static batching, paged vs contiguous KV, prefix caching on vs off, interactive
 * vs batch priority, and llmserve vs node-llama-cpp. In-process (the serving core over the
 * engine, no HTTP), so each table isolates the mechanism it is about.
 *
 *   deno run -A bench/compare.ts                 # everything, a couple of minutes on 2 cores
 *   deno run -A bench/compare.ts --only kv,prefix --quick
 */
import { parseArgs } from "@std/cli/parse-args";
import type { BackendChoice } from "../lib/compose/engine_factory.ts";
import { type BatchingOptions, type BatchingResult, compareBatching } from "./compare_batching.ts";
import { loadBenchModel } from "./compare_common.ts";
import { compareKv, type KvOptions, type KvResult } from "./compare_kv.ts";
import { compareLlamaCpp, type LlamaCppOptions, type LlamaCppResult } from "./compare_llama_cpp.ts";
import { comparePrefix, type PrefixOptions, type PrefixResult } from "./compare_prefix.ts";
import { comparePriority, type PriorityOptions, type PriorityResult } from "./compare_priority.ts";
import { type MachineInfo, machineInfo, machineLine } from "./machine.ts";
import { modelMirror } from "../tests/harness/server_process.ts";

export const SECTIONS = ["batching", "kv", "prefix", "priority", "llama-cpp"] as const;
export type Section = typeof SECTIONS[number];

export interface CompareOptions {
  readonly model: string;
  /** Engine of the batching, KV, prefix and priority sections. */
  readonly backend: BackendChoice;
  readonly sections: readonly Section[];
  readonly seed: number;
  /** Tiny sizes: seconds instead of minutes (smoke test). */
  readonly quick: boolean;
  readonly llamaCpp: Omit<LlamaCppOptions, "log">;
  readonly outDir: string | null;
  readonly log?: (line: string) => void;
}

export interface CompareReport {
  readonly date: string;
  readonly machine: MachineInfo;
  readonly command: string;
  readonly seconds: number;
  readonly batching?: BatchingResult;
  readonly kv?: KvResult;
  readonly prefix?: PrefixResult;
  readonly priority?: PriorityResult;
  readonly llamaCpp?: LlamaCppResult;
  readonly markdown: string;
  readonly files: string[];
}

/** Section sizes: full ones for the README, quick ones for the smoke test. */
export function sectionOptions(o: Pick<CompareOptions, "backend" | "seed" | "quick">) {
  const q = o.quick;
  const batching: BatchingOptions = {
    requests: q ? 8 : 64,
    ratePerSecond: q ? 40 : 14,
    batchSize: q ? 4 : 32,
    promptTokens: { min: 8, max: q ? 16 : 64 },
    outputTokens: { min: q ? 4 : 16, max: q ? 16 : 192 },
    seed: o.seed,
    backend: o.backend,
    maxBatchTokens: 512,
  };
  const kv: KvOptions = {
    requests: q ? 8 : 48,
    memorySequences: q ? 1 : 8,
    blockSize: 16,
    promptTokens: { min: 16, max: q ? 32 : 128 },
    outputTokens: { min: q ? 16 : 128, max: q ? 48 : 384 },
    seed: o.seed,
    backend: o.backend,
  };
  const prefix: PrefixOptions = {
    requests: q ? 3 : 16,
    systemTokens: q ? 64 : 384,
    userTokens: { min: 8, max: 24 },
    maxTokens: q ? 4 : 16,
    concurrency: 1,
    seed: o.seed,
    backend: o.backend,
  };
  const priority: PriorityOptions = {
    batchClients: q ? 6 : 24,
    batchPromptTokens: 32,
    batchMaxTokens: q ? 24 : 96,
    interactiveRequests: q ? 3 : 24,
    interactiveRatePerSecond: 4,
    interactivePromptTokens: 16,
    interactiveMaxTokens: 8,
    maxRunning: q ? 2 : 8,
    seed: o.seed,
    backend: o.backend,
  };
  return { batching, kv, prefix, priority };
}

export async function runCompare(o: CompareOptions): Promise<CompareReport> {
  const log = o.log ?? ((l: string) => console.error(l));
  const started = performance.now();
  const bm = await loadBenchModel(o.model);
  const s = sectionOptions(o);
  const has = (x: Section) => o.sections.includes(x);
  const timed = async <T>(name: string, f: () => Promise<T>): Promise<T> => {
    log(`${name}...`);
    const t = performance.now();
    const r = await f();
    log(`${name}: ${((performance.now() - t) / 1000).toFixed(1)} s`);
    return r;
  };
  const batching = has("batching")
    ? await timed("continuous vs static batching", () => compareBatching(bm, s.batching))
    : undefined;
  const kv = has("kv")
    ? await timed("paged vs contiguous KV", () => compareKv(bm, s.kv))
    : undefined;
  const prefix = has("prefix")
    ? await timed("prefix caching", () => comparePrefix(bm, s.prefix))
    : undefined;
  const priority = has("priority")
    ? await timed("priority", () => comparePriority(bm, s.priority))
    : undefined;
  const llamaCpp = has("llama-cpp")
    ? await timed("node-llama-cpp", () => compareLlamaCpp(bm, { ...o.llamaCpp, log }))
    : undefined;
  const seconds = (performance.now() - started) / 1000;
  const machine = machineInfo();
  const date = new Date().toISOString();
  const command = `deno run -A bench/compare.ts ${Deno.args.join(" ")}`.trim();
  const markdown = [
    `## Comparisons (${date.slice(0, 10)})`,
    "",
    `${date}, ${machineLine(machine)}; model ${o.model.split("/").pop()}; took ${
      seconds.toFixed(0)
    } s.`,
    "",
    `\`${command}\``,
    "",
    ...[batching, kv, prefix, priority, llamaCpp].filter((x) => x !== undefined).map((x) =>
      x.markdown
    ),
  ].join("\n");
  const files: string[] = [];
  const report: CompareReport = {
    date,
    machine,
    command,
    seconds,
    batching,
    kv,
    prefix,
    priority,
    llamaCpp,
    markdown,
    files,
  };
  if (o.outDir !== null) {
    await Deno.mkdir(o.outDir, { recursive: true });
    const json = `${o.outDir}/compare.json`, md = `${o.outDir}/compare.md`;
    await Deno.writeTextFile(
      json,
      JSON.stringify(
        report,
        (_k, v) => (typeof v === "number" && !Number.isFinite(v) ? null : v),
        2,
      ),
    );
    await Deno.writeTextFile(md, markdown);
    files.push(json, md);
  }
  return report;
}

export function parseCompareArgs(argv: string[]): CompareOptions {
  const f = parseArgs(argv, {
    string: [
      "model",
      "backend",
      "ours",
      "only",
      "seed",
      "out",
      "llama-cpp-prefix",
      "llama-threads",
      "tokens",
      "parallel",
      "repeats",
      "temperature",
    ],
    boolean: ["quick", "no-llama-cpp", "no-out", "help"],
  });
  if (f.help) {
    console.log(USAGE);
    Deno.exit(0);
  }
  const sections = (f.only ?? SECTIONS.join(",")).split(",") as Section[];
  for (const x of sections) {
    if (!SECTIONS.includes(x)) {
      throw new Error(
        `Invalid --only: unknown section ${JSON.stringify(x)}; expected some of ${
          SECTIONS.join(", ")
        }`,
      );
    }
  }
  const backend = (f.backend ?? "cpu") as BackendChoice;
  const quick = f.quick === true;
  return {
    model: f.model ?? `${modelMirror()}/stories260K-ctx512.gguf`,
    backend,
    sections,
    seed: Number(f.seed ?? "1"),
    quick,
    llamaCpp: {
      parallel: (f.parallel ?? (quick ? "1,4" : "1,32")).split(",").map(Number),
      tokens: Number(f.tokens ?? (quick ? "16" : "128")),
      prompt: "Once upon a time",
      temperature: Number(f.temperature ?? "0.8"),
      repeats: Number(f.repeats ?? (quick ? "1" : "5")),
      threads: Number(f["llama-threads"] ?? "1"),
      backends: (f.ours ?? "cpu,webgpu").split(",") as BackendChoice[],
      prefix: f["llama-cpp-prefix"],
      skipLlamaCpp: f["no-llama-cpp"] === true,
    },
    outDir: f["no-out"] ? null : f.out ?? new URL("./out", import.meta.url).pathname,
  };
}

const USAGE = `Usage: deno task bench:compare [options]
  --only LIST             sections: ${SECTIONS.join(",")} (default all)
  --model PATH            GGUF (default $MODEL_MIRROR/stories260K-ctx512.gguf)
  --backend B             engine of the batching/kv/prefix/priority sections (default cpu)
  --ours LIST             our backends in the node-llama-cpp table (default cpu,webgpu)
  --parallel LIST         sequences in the node-llama-cpp table (default 1,32)
  --tokens N              tokens per sequence there (default 128)
  --repeats N             rounds there, medians reported (default 5)
  --temperature T         sampling temperature there (default 0.8; 0 = greedy)
  --llama-threads N       llama.cpp threads (default 1: the machine is shared; 2 cores)
  --llama-cpp-prefix DIR  reuse (or keep) a node-llama-cpp install there (default: temp dir)
  --no-llama-cpp          skip node-llama-cpp
  --quick                 tiny sizes (seconds): what the smoke test runs
  --seed N                (default 1)
  --out DIR               compare.json and compare.md (default bench/out); --no-out: none`;

if (import.meta.main) {
  const report = await runCompare(parseCompareArgs(Deno.args));
  console.log(report.markdown);
  for (const f of report.files) console.error(`wrote ${f}`);
}
