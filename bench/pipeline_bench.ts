/**
 * Pipeline parallelism on this machine: decode tokens/s of one process (one CPU engine thread)
 * against PP 2 (the first stage in this process, the second a `stage` process on a local
 * nats-server, one thread each), with the whole step at once and with 2 micro-batches, at 1
 * and 32 streams, and one process with 2 threads (the same cores as PP 2); and the time a decode step of one stream gains per pipeline (PP 2 against one
 * process: two hops, rows to the stage and the result back). Steps are issued as the scheduler
 * does, up to 3 in flight, each decode from the token sampled last. Variants alternate.
 *
 *   deno run --allow-all bench/pipeline_bench.ts [--model /tmp/perf/llama32-1b-gemm-q4_k_m.gguf] [--steps 16]
 */
import { parseArgs } from "@std/cli/parse-args";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { stagePlacement } from "../kernels/wasm/stage_placement.ts";
import { PipelineEngine } from "../lib/engine/pipeline_engine.ts";
import { type Engine, GREEDY, type SeqInput } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { connectNats } from "../lib/cluster/nats_connection.ts";
import { attachStages } from "../lib/cluster/stage_client.ts";
import { modelIdentity } from "../lib/cluster/model_identity.ts";
import { startLocalNats } from "../lib/cli/local_nats.ts";
import { evenRanges } from "../lib/cli/pipeline_head.ts";
import { fmt, table } from "./stats.ts";

const args = parseArgs(Deno.args, { string: ["model", "steps"] });
const path = args.model ?? "/tmp/perf/llama32-1b-gemm-q4_k_m.gguf";
const steps = Number(args.steps ?? 16);
const CTX = 1024, PROMPT = 16, DEPTH = 3;
const LIMITS = { maxBatchTokens: 512, maxSeqs: 32 };
const KV = { numBlocks: 32 * 4, blockSize: 16 };

/** Prefills `n` prompts, then `steps` decode steps with DEPTH in flight; decode tokens/s and ms per step. */
async function decode(
  engine: Engine,
  n: number,
  seqBase: number,
): Promise<{ tps: number; stepMs: number }> {
  const seq = (i: number, step: number): SeqInput => ({
    seqId: seqBase + i,
    tokens: step === 0 ? Array.from({ length: PROMPT }, (_, j) => 1000 + 37 * i + j) : [],
    ...(step === 0 ? {} : { useLastSampled: true }),
    startPos: step === 0 ? 0 : PROMPT + step - 1,
    blockTable: [4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3],
    sample: true,
    sampling: GREEDY,
  });
  const ids = Array.from({ length: n }, (_, i) => i);
  await engine.step({ stepId: 0, seqs: ids.map((i) => seq(i, 0)) });
  const t0 = performance.now();
  const inFlight: Promise<unknown>[] = [];
  for (let s = 1; s <= steps; s++) {
    if (inFlight.length >= DEPTH) await inFlight[inFlight.length - DEPTH];
    inFlight.push(engine.step({ stepId: s, seqs: ids.map((i) => seq(i, s)) }));
  }
  await Promise.all(inFlight);
  const ms = performance.now() - t0;
  ids.forEach((i) => engine.release?.(seqBase + i));
  return { tps: (n * steps) / (ms / 1000), stepMs: ms / steps };
}

const whole = await loadModel(path, { contextLength: CTX });
const single = await WasmEngine.create(whole.config, whole.weights, KV, { ...LIMITS, threads: 1 });
const double = await WasmEngine.create(whole.config, whole.weights, KV, { ...LIMITS, threads: 2 });
const ranges = evenRanges(whole.config.nLayers, 2);
const head = await loadModel(path, {
  contextLength: CTX,
  placeTensors: stagePlacement(ranges[0]!, path),
});
const nats = await startLocalNats();
const main = new URL("../main.ts", import.meta.url).pathname;
const stage = new Deno.Command(Deno.execPath(), {
  args: [
    "run",
    "--allow-all",
    main,
    "stage",
    "--model",
    path,
    "--layers",
    `${ranges[1]!.start}-${ranges[1]!.end}`,
    "--threads",
    "1",
    "--context-length",
    String(CTX),
  ],
  env: { LLMSERVE_NATS: nats.url },
  stdout: "null",
  stderr: "null",
}).spawn();
const nc = await connectNats({ url: nats.url, name: "bench-head" });
// One attach (a stage serves one head), shared by both ways of driving it.
const first = await WasmEngine.create(head.config, head.weights, KV, {
  ...LIMITS,
  threads: 1,
  layers: ranges[0]!,
});
const remote = await attachStages(nc, {
  model: await modelIdentity(path, CTX),
  ranges: [ranges[1]!],
  kv: KV,
  limits: LIMITS,
  contextLength: CTX,
  timeoutMs: 300_000,
});
const pp = (groups: number) =>
  new PipelineEngine(head.config, KV, [first, ...remote], LIMITS, groups);
const variants: [string, Engine][] = [
  ["1 process, 1 thread", single],
  ["PP 2, 1 thread each, whole steps", pp(1)],
  ["PP 2, 1 thread each, 2 micro-batches", pp(2)],
  ["1 process, 2 threads", double],
];
const rows: string[][] = [];
const results = new Map<string, { tps: number; stepMs: number }[]>();
let base = 0;
for (const n of [1, 32]) {
  for (let rep = 0; rep < 2; rep++) {
    for (const [name, e] of variants) {
      const r = await decode(e, n, base += 100);
      const key = `${n}|${name}`;
      results.set(key, [...(results.get(key) ?? []), r]);
    }
  }
}
for (const n of [1, 32]) {
  const best = (name: string) =>
    results.get(`${n}|${name}`)!.reduce((a, b) => (a.tps > b.tps ? a : b));
  const one = best(variants[0]![0]);
  for (const [name] of variants) {
    const r = best(name);
    rows.push([String(n), name, fmt(r.tps, 1), fmt(r.stepMs, 1), fmt(r.tps / one.tps, 2)]);
  }
}
console.log(
  `${path}, ${steps} decode steps after a ${PROMPT}-token prompt, ${DEPTH} steps in flight, best of 2 alternating runs; load average ${
    Deno.loadavg().map((l) => l.toFixed(2)).join(" ")
  }`,
);
console.log(table(["streams", "layout", "decode tok/s", "ms/step", "× 1 process"], rows));
const hop = (best: (n: string) => { stepMs: number }) =>
  best(variants[1]![0]).stepMs - best(variants[0]![0]).stepMs;
console.log(
  `added per decode step at 1 stream, PP 2 whole steps against 1 process (2 hops): ${
    fmt(hop((name) => results.get(`1|${name}`)!.reduce((a, b) => (a.stepMs < b.stepMs ? a : b))), 2)
  } ms`,
);
const rss = (await Deno.readTextFile(`/proc/${stage.pid}/status`)).match(/VmRSS:\s+(\d+) kB/)?.[1];
const file = (await Deno.stat(path)).size;
console.log(
  `stage process (layers ${ranges[1]!.start}-${ranges[1]!.end} and the classifier): RSS ${
    fmt(Number(rss) / 1024, 0)
  } MiB, of a ${fmt(file / 2 ** 20, 0)} MiB file`,
);
single.dispose();
double.dispose();
variants[1]![1].dispose();
await nc.close();
stage.kill("SIGTERM");
await stage.status;
await nats.stop();
