/**
 * Two source trees' CPU engines in one process, on one GGUF file: decode steps alternate between
 * them round by round (A B, then B A), so that a shared machine's load falls on both alike. Prints
 * per side the 10th percentile and the median of the step's wall time and the process's CPU time
 * per step (/proc/self/stat, all threads), and whether both sampled the same tokens (greedy). For
 * a kernel change, the other tree is a `git worktree add` or `git archive | tar -x` of the commit
 * before it; its kernels are the .wasm files committed there.
 *
 *   deno run -A --config deno.json bench/cpu_engine_ab.ts --other /tmp/old-tree \
 *     --model /tmp/perf/qwen25-05b-q4_k_m.gguf [--npl 1] [--threads 2] [--rounds 8] [--steps 8]
 */
import { parseArgs } from "@std/cli/parse-args";
import type { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { GREEDY, type SeqInput } from "../lib/engine/engine.ts";

const args = parseArgs(Deno.args, {
  string: ["model", "other", "npl", "threads", "rounds", "steps"],
  default: { npl: "1", threads: "2", rounds: "8", steps: "8" },
});
if (!args.model || !args.other) {
  console.error(
    "Usage: deno run -A --config deno.json bench/cpu_engine_ab.ts --other <source tree> --model <gguf> [--npl 1] [--threads 2] [--rounds 8] [--steps 8]",
  );
  Deno.exit(2);
}
const npl = Number(args.npl), threads = Number(args.threads);
const rounds = Number(args.rounds), steps = Number(args.steps);
const PROMPT = 16;

/** This process's user + system CPU time in ms (all threads). */
function cpuMs(): number {
  const f = Deno.readTextFileSync("/proc/self/stat").split(") ")[1]!.split(" ");
  return ((Number(f[11]) + Number(f[12])) * 1000) / 100;
}

interface Side {
  readonly name: string;
  readonly engine: WasmEngine;
  readonly vocab: number;
  readonly blocksPerSeq: number;
  pos: number;
  last: number[];
  readonly wall: number[];
  cpu: number;
  readonly tokens: number[][];
}

/** Loads the model into the engine of the tree at `root` (its own modules, heap and kernels). */
async function side(name: string, root: URL): Promise<Side> {
  const { loadModel } = await import(new URL("lib/model/load_model.ts", root).href);
  const { WasmEngine } = await import(new URL("kernels/wasm/wasm_engine.ts", root).href);
  const { wasmHeap } = await import(new URL("kernels/wasm/heap.ts", root).href);
  const { placeInHeaps } = await import(new URL("kernels/wasm/tensor_placement.ts", root).href);
  const heap = wasmHeap();
  const model = await loadModel(args.model!, {
    allocate: (n: number) => heap.bytes(n, "the model's weights"),
    placeTensors: placeInHeaps,
  });
  const blocksPerSeq = Math.ceil((PROMPT + rounds * steps + 1) / 16);
  const engine = await WasmEngine.create(
    model.config,
    model.weights,
    { numBlocks: npl * blocksPerSeq, blockSize: 16 },
    { threads, maxSeqs: npl, maxBatchTokens: Math.max(512, npl * PROMPT) },
  );
  return {
    name,
    engine,
    vocab: model.config.vocabSize,
    blocksPerSeq,
    pos: 0,
    last: [],
    wall: [],
    cpu: 0,
    tokens: [],
  };
}

/** One step of every sequence with `tokens` (each sequence's new tokens); the sampled ones. */
async function step(s: Side, tokens: number[][]): Promise<number[]> {
  const seqs: SeqInput[] = tokens.map((t, i) => ({
    seqId: i,
    tokens: t,
    startPos: s.pos,
    blockTable: Array.from({ length: s.blocksPerSeq }, (_, b) => i * s.blocksPerSeq + b),
    sample: true,
    sampling: GREEDY,
  }));
  const r = await s.engine.step({ stepId: s.pos, seqs });
  s.pos += tokens[0]!.length;
  return r.sampled.map((x) => x.token);
}

const here = new URL("../", import.meta.url);
const other = new URL(
  args.other.endsWith("/") ? args.other : `${args.other}/`,
  `file://${Deno.cwd()}/`,
);
const sides = [await side("this tree", here), await side(args.other, other)];
for (const s of sides) {
  const prompts = Array.from(
    { length: npl },
    (_, i) => Array.from({ length: PROMPT }, (_, j) => (17 + 31 * i + 7 * j) % s.vocab),
  );
  s.last = await step(s, prompts);
}
for (let r = 0; r < rounds; r++) {
  for (const s of r % 2 ? [...sides].reverse() : sides) {
    const c0 = cpuMs();
    for (let k = 0; k < steps; k++) {
      const t0 = performance.now();
      s.last = await step(s, s.last.map((t) => [t]));
      s.wall.push(performance.now() - t0);
      s.tokens.push(s.last);
    }
    s.cpu += cpuMs() - c0;
  }
}
const at = (xs: number[], p: number) =>
  [...xs].sort((a, b) => a - b)[Math.floor(p * (xs.length - 1))]!;
const load = Deno.readTextFileSync("/proc/loadavg").split(" ").slice(0, 3).join(" ");
const same = JSON.stringify(sides[0]!.tokens) === JSON.stringify(sides[1]!.tokens);
console.log(
  `${
    args.model.split("/").pop()
  }, ${npl} sequence(s), ${threads} threads, ${rounds} rounds × ${steps} steps, load ${load}; same tokens: ${same}`,
);
console.log(
  "| tree | step p10 ms | tok/s at p10 | step median ms | tok/s at median | CPU ms a step |",
);
console.log("|---|---:|---:|---:|---:|---:|");
for (const s of sides) {
  const p10 = at(s.wall, 0.1), med = at(s.wall, 0.5);
  console.log(
    `| ${s.name} | ${p10.toFixed(1)} | ${(npl * 1000 / p10).toFixed(1)} | ${med.toFixed(1)} | ${
      (npl * 1000 / med).toFixed(1)
    } | ${(s.cpu / s.wall.length).toFixed(1)} |`,
  );
}
for (const s of sides) s.engine.dispose();
if (!same) Deno.exit(1);
Deno.exit(0);
