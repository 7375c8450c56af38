/**
 * First-request latency of a model in a server of several models: cold (its first load in the
 * process), warm (loaded), reloaded from its parsed file (kept when keep_alive 0 unloaded it),
 * and reloaded from the file (after an eviction, which drops the parsed file). The server's own
 * "loaded in N s" lines give the load alone.
 *
 *   deno run -A bench/model_reload_bench.ts [--model /tmp/perf/qwen25-05b-q4_k_m.gguf]
 *     [--other <small gguf>] [--rounds 3] [--backend cpu]
 *
 * The file's pages are in the OS page cache after the first read, so "from the file" is a read
 * from memory, not from disk: what reusing the parsed file saves on top of that is the copy
 * into the engine's memory, the GGUF parse and weight checks, and the tokenizer's build.
 */
import { parseArgs } from "@std/cli/parse-args";
import { markdownTable } from "./markdown_table.ts";
import { startServer } from "../tests/harness/server_process.ts";

const flags = parseArgs(Deno.args, {
  string: ["model", "other", "rounds", "backend"],
  default: {
    model: "/tmp/perf/qwen25-05b-q4_k_m.gguf",
    rounds: "3",
    backend: "cpu",
  },
});
const mirror = Deno.env.get("MODEL_MIRROR") ?? "../shared/models";
const other = flags.other ?? `${mirror}/compat/stories260K-q4_1.gguf`;
const rounds = Number(flags.rounds);
const stem = (p: string) => p.split("/").pop()!.replace(/\.gguf$/, "");
const big = stem(flags.model);

const server = await startServer({
  args: [
    "--backend",
    flags.backend,
    "--kv-memory",
    "64MiB",
    "--context-length",
    "1024",
    "--max-loaded-models",
    "1",
    "--model",
    flags.model,
    "--model",
    other,
  ],
  startTimeoutMs: 120_000,
});

/** Milliseconds from sending a one-token greedy completion to its whole answer. */
async function firstRequest(model: string, extra: Record<string, unknown> = {}): Promise<number> {
  const t0 = performance.now();
  const res = await fetch(`${server.base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model,
      prompt: "Once upon a time",
      max_tokens: 1,
      temperature: 0,
      ...extra,
    }),
  });
  const body = await res.json();
  if (res.status !== 200) throw new Error(`${model}: ${res.status} ${JSON.stringify(body)}`);
  return performance.now() - t0;
}

async function phase(model: string): Promise<string> {
  return (await (await fetch(`${server.base}/health`)).json()).models[model].phase;
}

async function untilUnloaded(model: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (await phase(model) !== "unloaded") {
    if (Date.now() > deadline) throw new Error(`${model} was not unloaded within 60 s`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** The seconds of the server's n-th "model <name> loaded in" line (from 0). */
function loadSeconds(model: string): number[] {
  const re = new RegExp(`model ${model} loaded in ([\\d.]+) s \\(\\d+ waiting(; reused)?`, "g");
  return [...server.log().matchAll(re)].map((m) => Number(m[1]));
}

interface Samples {
  readonly ms: number[];
  readonly load: number[];
}
const samples: { cold: Samples; warm: Samples; file: Samples; cache: Samples } = {
  cold: { ms: [], load: [] },
  warm: { ms: [], load: [] },
  file: { ms: [], load: [] },
  cache: { ms: [], load: [] },
};
try {
  for (let r = 0; r < rounds; r++) {
    const loadsBefore = loadSeconds(big).length;
    if (r === 0) samples.cold.ms.push(await firstRequest(big));
    else {
      // Evicted for the other model (one model at most): its parsed file went with it.
      await firstRequest(stem(other));
      samples.file.ms.push(await firstRequest(big));
    }
    (r === 0 ? samples.cold : samples.file).load.push(loadSeconds(big)[loadsBefore]!);
    samples.warm.ms.push(await firstRequest(big));
    // keep_alive 0: unloaded after this request, its parsed file kept.
    await firstRequest(big, { keep_alive: 0 });
    await untilUnloaded(big);
    const n = loadSeconds(big).length;
    samples.cache.ms.push(await firstRequest(big));
    const line = server.log().split("\n").filter((l) => l.startsWith(`model ${big} loaded in`))
      .pop()!;
    if (!line.includes("reused its parsed file")) throw new Error(`not reused: ${line}`);
    samples.cache.load.push(loadSeconds(big)[n]!);
  }
} finally {
  await server.stop("SIGTERM");
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.floor(s.length / 2)]!;
};
const rows: [string, keyof typeof samples][] = [
  ["cold: first load in the process", "cold"],
  ["warm: loaded", "warm"],
  ["reloaded from the parsed file (keep_alive 0)", "cache"],
  ["reloaded from the file (after an eviction)", "file"],
];
console.log(
  `\n${big} (${flags.backend}), ${rounds} rounds; one-token greedy completion, median\n`,
);
console.log(markdownTable(
  ["first request", "latency ms", "of it the load, s", "samples"],
  rows.filter(([, k]) => samples[k].ms.length > 0).map(([label, k]) => [
    label,
    median(samples[k].ms).toFixed(0),
    samples[k].load.length > 0 ? median(samples[k].load).toFixed(2) : "-",
    String(samples[k].ms.length),
  ]),
));
if (samples.file.ms.length > 0) {
  console.log(
    `\nreusing the parsed file saves ${
      ((median(samples.file.ms) - median(samples.cache.ms)) / 1000).toFixed(2)
    } s of the first request (load: ${median(samples.file.load).toFixed(2)} s -> ${
      median(samples.cache.load).toFixed(2)
    } s)`,
  );
}
