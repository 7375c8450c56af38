/**
 * Tensor parallelism on this machine: decode ms per step and tokens/s of one process (one CPU
 * engine thread) against TP 2 with one thread per rank, rank 1 in this process (LocalTpGroup)
 * or a `stage --tp-rank 1/2` process on a local nats-server (gathers over its link), at 1 and
 * 16 streams; and how long rank 0 waits at its gathers per step (the link's round trips plus
 * any wait for the other rank's columns). Steps are issued as the scheduler does, up to 3 in
 * flight. Variants alternate; medians of the runs.
 *
 *   deno run --allow-all bench/tp_bench.ts [--model ../shared/models/compat/llama3-like-q4_k_m.gguf] [--steps 16] [--runs 3]
 */
import { parseArgs } from "@std/cli/parse-args";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { LocalTpGroup, type TpExchange, tpShard } from "../kernels/wasm/tp_shard.ts";
import { TP_GATHERS_PER_LAYER } from "../kernels/wasm/tp_program.ts";
import { TensorParallelEngine } from "../lib/engine/tensor_parallel_engine.ts";
import { type Engine, GREEDY, type SeqInput } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { connectNats } from "../lib/cluster/nats_connection.ts";
import { attachStages } from "../lib/cluster/stage_client.ts";
import { modelIdentity } from "../lib/cluster/model_identity.ts";
import { HubGather } from "../lib/cluster/tp_link.ts";
import { startLocalNats } from "../lib/cli/local_nats.ts";
import { fmt, table } from "./stats.ts";

const args = parseArgs(Deno.args, { string: ["model", "steps", "runs"] });
const path = args.model ??
  new URL("../../shared/models/compat/llama3-like-q4_k_m.gguf", import.meta.url).pathname;
const steps = Number(args.steps ?? 16), runs = Number(args.runs ?? 3);
const CTX = 1024, PROMPT = 16, DEPTH = 3;
const LIMITS = { maxBatchTokens: 512, maxSeqs: 16 };
const KV = { numBlocks: 16 * 4, blockSize: 16 };

/** Rank 0's time waiting in its exchange, and its gathers. */
class TimedExchange implements TpExchange {
  ms = 0;
  calls = 0;
  constructor(readonly inner: TpExchange) {}
  async exchange(local: Float32Array): Promise<readonly Float32Array[]> {
    const t0 = performance.now();
    try {
      return await this.inner.exchange(local);
    } finally {
      this.ms += performance.now() - t0;
      this.calls++;
    }
  }
}

/** Prefills `n` prompts, then `steps` decode steps with DEPTH in flight: ms per decode step. */
async function decode(engine: Engine, n: number, seqBase: number): Promise<number> {
  const seq = (i: number, step: number): SeqInput => ({
    seqId: seqBase + i,
    tokens: step === 0 ? Array.from({ length: PROMPT }, (_, j) => 100 + 37 * i + j) : [],
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
  return ms / steps;
}

const m = await loadModel(path, { contextLength: CTX });
const single = await WasmEngine.create(m.config, m.weights, KV, { ...LIMITS, threads: 1 });

// TP 2 in this process.
const group = new LocalTpGroup(2);
const localTimed = new TimedExchange(group.member(0));
const local = new TensorParallelEngine(m.config, KV, [
  await WasmEngine.create(m.config, m.weights, KV, {
    ...LIMITS,
    threads: 1,
    tensorParallel: { shard: tpShard(m.config, 0, 2), exchange: localTimed },
  }),
  await WasmEngine.create(m.config, m.weights, KV, {
    ...LIMITS,
    threads: 1,
    tensorParallel: { shard: tpShard(m.config, 1, 2), exchange: group.member(1) },
  }),
], LIMITS);

// TP 2 with rank 1 a stage process.
const nats = await startLocalNats();
const rank1 = new Deno.Command(Deno.execPath(), {
  args: [
    "run",
    "--allow-all",
    new URL("../main.ts", import.meta.url).pathname,
    "stage",
    "--model",
    path,
    "--tp-rank",
    "1/2",
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
const hub = new HubGather();
const linkTimed = new TimedExchange(hub);
const r0 = await WasmEngine.create(m.config, m.weights, KV, {
  ...LIMITS,
  threads: 1,
  tensorParallel: { shard: tpShard(m.config, 0, 2), exchange: linkTimed },
});
const remote = await attachStages(nc, {
  model: await modelIdentity(path, CTX),
  ranges: [{ start: 0, end: m.config.nLayers }],
  tpSize: 2,
  kv: KV,
  limits: LIMITS,
  contextLength: CTX,
  timeoutMs: 300_000,
});
hub.attach(remote);
const linked = new TensorParallelEngine(m.config, KV, [r0, ...remote], LIMITS, (e) => hub.fail(e));

const variants: [string, Engine, TimedExchange | undefined][] = [
  ["1 process, 1 thread", single, undefined],
  ["TP 2 in one process, 1 thread each", local, localTimed],
  ["TP 2, rank 1 a stage process, 1 thread each", linked, linkTimed],
];
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const results = new Map<string, { stepMs: number; waitMs: number }[]>();
let base = 0;
for (const n of [1, 16]) {
  for (let rep = 0; rep < runs; rep++) {
    for (const [name, e, timed] of variants) {
      const before = timed ? { ms: timed.ms, calls: timed.calls } : undefined;
      const stepMs = await decode(e, n, base += 100);
      // Wait per decode step (the prefill's gathers are in the counts too: scaled by calls).
      const waitMs = timed && before
        ? ((timed.ms - before.ms) / (timed.calls - before.calls)) *
          TP_GATHERS_PER_LAYER * m.config.nLayers
        : 0;
      const key = `${n}|${name}`;
      results.set(key, [...(results.get(key) ?? []), { stepMs, waitMs }]);
    }
  }
}
const rows: string[][] = [];
for (const n of [1, 16]) {
  const one = median(results.get(`${n}|${variants[0]![0]}`)!.map((r) => r.stepMs));
  for (const [name, , timed] of variants) {
    const rs = results.get(`${n}|${name}`)!;
    const stepMs = median(rs.map((r) => r.stepMs));
    const waitMs = median(rs.map((r) => r.waitMs));
    rows.push([
      String(n),
      name,
      fmt(stepMs, 2),
      fmt((n * 1000) / stepMs, 1),
      fmt(one / stepMs, 2),
      timed ? `${fmt(waitMs, 2)} (${fmt((100 * waitMs) / stepMs, 0)}%)` : "",
    ]);
  }
}
const { dim, hiddenDim, nHeads, headDim, nLayers } = m.config;
console.log(
  `${path}: ${nLayers} layers, ${TP_GATHERS_PER_LAYER * nLayers} gathers a step of ${
    nHeads * headDim + 2 * dim + hiddenDim
  } f32 a token a layer; ${steps} decode steps after a ${PROMPT}-token prompt, ${DEPTH} in flight, median of ${runs} alternating runs; load average ${
    Deno.loadavg().map((l) => l.toFixed(2)).join(" ")
  }`,
);
console.log(
  table(
    ["streams", "layout", "ms/step", "decode tok/s", "× 1 process", "rank 0 at gathers, ms/step"],
    rows,
  ),
);
single.dispose();
local.dispose();
linked.dispose();
await nc.close();
rank1.kill("SIGTERM");
await rank1.status;
await nats.stop();
