/**
 * Where a CPU-engine decode step goes: times decode steps whose programs keep one kind of op
 * alone (each op with its barrier), or only the barriers, or nothing (the host's work and the
 * hand-offs to the threads), alternating the variants round by round. Each figure is the 10th
 * percentile of its steps, so that the machine's other load counts least. The results of such
 * steps are wrong; only their time is read.
 *
 *   deno run -A bench/decode_profile.ts --model /tmp/perf/qwen25-05b-gemm-q4_k_m.gguf \
 *     [--threads 2] [--steps 16] [--rounds 7] [--sequences 1]
 */
import { parseArgs } from "@std/cli/parse-args";
import { loadModel } from "../lib/model/load_model.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { wasmHeap } from "../kernels/wasm/heap.ts";
import { placeInHeaps } from "../kernels/wasm/tensor_placement.ts";
import { GREEDY, type SeqInput } from "../lib/engine/engine.ts";
import { OP, ProgramWriter } from "../kernels/wasm/program.ts";
import { stepMatrixBytes } from "../lib/model/weights.ts";

const args = parseArgs(Deno.args, {
  string: ["model", "threads", "steps", "rounds", "sequences"],
  default: { threads: "2", steps: "16", rounds: "7", sequences: "1" },
});
if (!args.model) {
  console.error(
    "Usage: deno run -A bench/decode_profile.ts --model <gguf> [--threads 2] [--steps 16] [--rounds 7] [--sequences 1]",
  );
  Deno.exit(2);
}
const threads = Number(args.threads), steps = Number(args.steps), rounds = Number(args.rounds);
const nseq = Number(args.sequences);

const MATMULS = ["wq", "wk", "wv", "wo", "gate", "up", "down"];
const NAMES: Record<number, string> = {
  [OP.normQuant]: "norm+quantize",
  [OP.qkvPost]: "qkv post (RoPE, KV write)",
  [OP.attention]: "attention",
  [OP.quant]: "quantize (attention out)",
  [OP.swiglu]: "swiglu+quantize",
  [OP.rowStats]: "logit row stats",
};

/** What the patched writer does: the op kinds it drops, and whether it drops every barrier. */
const variant = { keep: undefined as string | undefined, barriersOnly: false, dropAll: false };
let matmulIndex = 0;
const realOp = ProgramWriter.prototype.op;
const realEnd = ProgramWriter.prototype.end;
ProgramWriter.prototype.op = function (code, fields, barrier = true) {
  let kind = NAMES[code] ?? `op ${code}`;
  if (code === OP.matmul) {
    kind = fields[2] === vocab ? "matmul output" : `matmul ${MATMULS[matmulIndex++ % 7]}`;
  }
  if (variant.dropAll || (variant.keep !== undefined && variant.keep !== kind)) return this;
  // A quantize op of no rows does nothing but its barrier.
  if (variant.barriersOnly) return barrier ? realOp.call(this, OP.quant, [0, 0, 0]) : this;
  return realOp.call(this, code, fields, barrier);
};
ProgramWriter.prototype.end = function () {
  matmulIndex = 0;
  return realEnd.call(this);
};

const heap = wasmHeap();
const model = await loadModel(args.model, {
  allocate: (n) => heap.bytes(n, "the model's weights"),
  placeTensors: (tensors) => placeInHeaps(tensors),
});
const vocab = model.config.vocabSize;
const per = Math.ceil((17 + steps) / 16);
const engine = await WasmEngine.create(
  model.config,
  model.weights,
  { numBlocks: per * nseq, blockSize: 16 },
  { threads, maxSeqs: nseq, maxBatchTokens: 512 },
);
const seq = (i: number, tokens: number[], pos: number): SeqInput => ({
  seqId: i,
  tokens,
  startPos: pos,
  blockTable: Array.from({ length: per }, (_, b) => i * per + b),
  sample: true,
  sampling: GREEDY,
});
// Every variant decodes from the same position range, so attention's share is alike.
const prompt = Array.from({ length: 16 }, (_, j) => (17 + 7 * j) % vocab);
await engine.step({
  stepId: 0,
  seqs: Array.from({ length: nseq }, (_, i) => seq(i, prompt, 0)),
});
let stepId = 1;
async function decodeMs(): Promise<number[]> {
  const times: number[] = [];
  for (let s = 0; s < steps; s++) {
    const t0 = performance.now();
    await engine.step({
      stepId: stepId++,
      seqs: Array.from({ length: nseq }, (_, i) => seq(i, [1 + (s % 100)], 16 + s)),
    });
    times.push(performance.now() - t0);
  }
  return times;
}
/** The 10th percentile: on this shared machine the least disturbed steps say what a step costs. */
function low(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor((s.length - 1) / 10)]!;
}

const kinds = [
  ...MATMULS.map((m) => `matmul ${m}`),
  "matmul output",
  ...Object.values(NAMES),
];
type V = { name: string; set: () => void };
const variants: V[] = [
  { name: "full", set: () => {} },
  ...kinds.map((k) => ({ name: k, set: () => (variant.keep = k) })),
  { name: "barriers alone", set: () => (variant.barriersOnly = true) },
  { name: "nothing", set: () => (variant.dropAll = true) },
];
const got = new Map<string, number[]>(variants.map((v) => [v.name, []]));
await decodeMs(); // warm-up
for (let r = 0; r < rounds; r++) {
  for (const v of variants) {
    variant.keep = undefined;
    variant.barriersOnly = false;
    variant.dropAll = false;
    v.set();
    got.get(v.name)!.push(...await decodeMs());
  }
}
engine.dispose();
const full = low(got.get("full")!);
const none = low(got.get("nothing")!);
const bytes = stepMatrixBytes(model.weights);
console.log(
  `${args.model.split("/").pop()}, ${threads} threads, ${nseq} sequence(s): step ${
    full.toFixed(2)
  } ms (10th percentile of ${rounds} rounds × ${steps} steps), ${
    (nseq * 1000 / full).toFixed(1)
  } tok/s, ` +
    `${(bytes / (full / 1000) / 1e9).toFixed(1)} GB/s of matrices; load ${
      Deno.loadavg().map((x) => x.toFixed(2)).join(" ")
    }\n`,
);
console.log("| only this in the step | step ms | less an empty step, ms | % of full step |");
console.log("|---|---:|---:|---:|");
let sum = 0;
for (const v of variants.slice(1)) {
  const t = low(got.get(v.name)!);
  const share = v.name === "nothing" ? t : t - none;
  if (v.name !== "barriers alone") sum += share;
  console.log(
    `| ${v.name} | ${t.toFixed(2)} | ${share.toFixed(2)} | ${(100 * share / full).toFixed(1)} |`,
  );
}
console.log(
  `\nsum of the parts ${sum.toFixed(2)} ms against the full step's ${full.toFixed(2)} ms`,
);
