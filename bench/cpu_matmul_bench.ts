/**
 * The CPU engine's matmul kernels alone, per weight type, on real-model shapes: weight GB/s at
 * 1 activation row (decode) against the plain read loop's bandwidth over the same bytes, and
 * activation rows/s at 16 and 64 rows (prefill). Random weights; the best of --repeats runs.
 * On a machine shared with other work, --cpu-iters N times N runs by this process's CPU time
 * (/proc/self/stat) instead of the wall clock, which counts the time the threads were not
 * scheduled: steadier for A/B comparisons of a kernel change. --compare FILE.wasm times another
 * build of the kernels (a copy of llmserve_relaxed.wasm from before a change) in the same run,
 * the two alternating --repeats times per cell (A B B A A B ...): each cell shows the medians,
 * this build's against FILE's, and fails if their outputs differ in any bit. FILE runs in a
 * memory of its own (its constant tables lie elsewhere).
 *
 *   deno run -A bench/cpu_matmul_bench.ts [--threads 1] [--rows 1,16,64] [--repeats 5]
 *     [--types q4_k,q6_k,q5_0,q8_0 (also q5_k, q3_k, q2_k)] [--cpu-iters N] [--compare FILE.wasm]
 *     [--shape q8_0:151936:896 ...] (shapes of your own instead of --types)
 */
import { parseArgs } from "@std/cli/parse-args";
import { WasmHeap, wasmHeap } from "../kernels/wasm/heap.ts";
import { ActBuffer } from "../kernels/wasm/act_buffer.ts";
import { ThreadPool } from "../kernels/wasm/pool.ts";
import { kernelModule } from "../kernels/wasm/kernel_module.ts";
import { OP, OP_WORDS, ProgramWriter } from "../kernels/wasm/program.ts";
import { readBandwidth } from "../kernels/wasm/read_bandwidth.ts";
import { byteSize, TENSOR_TYPES, type TensorType } from "../lib/model/tensor.ts";

const args = parseArgs(Deno.args, {
  string: ["threads", "rows", "repeats", "types", "cpu-iters", "compare", "shape"],
  collect: ["shape"],
  default: { threads: "1", rows: "1,16,64", repeats: "5", types: "q4_k,q6_k,q5_0,q8_0" },
});
const threads = Number(args.threads), repeats = Number(args.repeats);
const rowCounts = String(args.rows).split(",").map(Number);
// [type, N (weight rows), K]: Llama-3.2-1B's ffn_up (Q4_K) and ffn_down (Q6_K), Qwen2.5-0.5B's
// ffn_up (Q5_0) and a Q8_0 of the same shape.
const ALL_SHAPES: [TensorType, number, number][] = [
  ["q4_k", 8192, 2048],
  ["q6_k", 2048, 8192],
  ["q5_0", 4864, 896],
  ["q8_0", 4864, 896],
  // The other K-quants, on the Q4_K shape (only with --types).
  ["q5_k", 8192, 2048],
  ["q3_k", 8192, 2048],
  ["q2_k", 8192, 2048],
];
// --shape type:N:K (repeatable) replaces the list: e.g. a classifier too big for the caches.
const SHAPES: [TensorType, number, number][] = (args.shape as string[]).length > 0
  ? (args.shape as string[]).map((s) => {
    const [t, n, k] = s.split(":");
    if (!TENSOR_TYPES.includes(t as TensorType) || !(Number(n) > 0) || !(Number(k) > 0)) {
      throw new Error(`--shape wants type:N:K (e.g. q8_0:151936:896), received ${s}`);
    }
    return [t as TensorType, Number(n), Number(k)];
  })
  : ALL_SHAPES.filter(([t]) => String(args.types).split(",").includes(t));
const cpuIters = Number(args["cpu-iters"] ?? 0);
const TICKS_PER_S = 100;
/** This process's user + system CPU time in ms (all threads). */
function cpuMs(): number {
  const f = Deno.readTextFileSync("/proc/self/stat").split(") ")[1]!.split(" ");
  return ((Number(f[11]) + Number(f[12])) * 1000) / TICKS_PER_S;
}
const heap = wasmHeap();
const pool = await ThreadPool.start(heap, kernelModule().module, threads);
// The other build gets a memory of its own, with copies of the weights and activations: its
// static data (the kernels' constant tables) is laid out differently and would overwrite ours.
const otherHeap = args.compare === undefined ? undefined : new WasmHeap();
const other = otherHeap === undefined ? undefined : await ThreadPool.start(
  otherHeap,
  new WebAssembly.Module(Deno.readFileSync(args.compare!)),
  threads,
);
/** ms per run of `prog` on `p`: CPU time over --cpu-iters runs, or the wall clock of one. */
async function timeRun(p: ThreadPool, prog: number): Promise<number> {
  if (cpuIters === 0) {
    const t0 = performance.now();
    await p.run(prog);
    return performance.now() - t0;
  }
  const c0 = cpuMs();
  for (let i = 0; i < cpuIters; i++) await p.run(prog);
  return (cpuMs() - c0) / cpuIters / threads;
}
const median = (xs: number[]) => xs.sort((a, b) => a - b)[xs.length >> 1]!;
const maxRows = Math.max(...rowCounts);
console.log(
  `| type | N × K | MiB | ${
    rowCounts.map((r) => `${r} row${r > 1 ? "s" : ""}`).join(" | ")
  } | read loop GB/s |`,
);
console.log(`|---|---|---:|${rowCounts.map(() => "---:|").join("")}---:|`);
/** One build's copy of a shape's buffers, in its own memory. */
function buffers(h: WasmHeap, type: TensorType, N: number, K: number, bytes: number) {
  const w = h.alloc(bytes, "bench weights");
  const u8 = h.u8(w, bytes);
  for (let i = 0; i < bytes; i++) u8[i] = (i * 2654435761) >>> 25;
  const act = new ActBuffer(h, maxRows, K, "bench activations");
  const f = h.f32(act.f, maxRows * K);
  for (let i = 0; i < f.length; i++) f[i] = Math.sin(i);
  const out = h.alloc(maxRows * N * 4, "bench outputs");
  const prog = h.alloc(4 * OP_WORDS * 4, "bench program");
  return {
    h,
    w,
    out,
    prog,
    /** Quantizes `rows` activation rows, then writes the matmul over them as the program. */
    async prepare(p: ThreadPool, rows: number) {
      const pw = new ProgramWriter(h.i32(prog, 4 * OP_WORDS));
      pw.op(OP.quant, [act.desc, rows, K]).end();
      await p.run(prog);
      new ProgramWriter(h.i32(prog, 4 * OP_WORDS))
        .op(OP.matmul, [TENSOR_TYPES.indexOf(type), w, N, K, act.desc, rows, out, N, 0, 0]).end();
    },
    free() {
      h.free(w, bytes);
      h.free(out, maxRows * N * 4);
      h.free(prog, 4 * OP_WORDS * 4);
      act.free();
    },
  };
}
for (const [type, N, K] of SHAPES) {
  const bytes = byteSize(type, [N, K]);
  const mineBufs = buffers(heap, type, N, K, bytes);
  const otherBufs = otherHeap && buffers(otherHeap, type, N, K, bytes);
  const cells: string[] = [];
  for (const rows of rowCounts) {
    await mineBufs.prepare(pool, rows);
    const prog = mineBufs.prog;
    const cell = (ms: number) =>
      rows === 1
        ? `${(bytes / ms / 1e6).toFixed(1)} GB/s`
        : `${(rows * 1000 / ms).toFixed(0)} rows/s`;
    await pool.run(prog);
    if (!other || !otherBufs) {
      let best = Infinity;
      for (let i = 0; i < repeats; i++) best = Math.min(best, await timeRun(pool, prog));
      cells.push(cell(best));
      continue;
    }
    await otherBufs.prepare(other, rows);
    await other.run(otherBufs.prog);
    const mine = heap.u8(mineBufs.out, rows * N * 4);
    if (otherHeap!.u8(otherBufs.out, rows * N * 4).some((x, i) => x !== mine[i])) {
      throw new Error(`${type}, ${rows} rows: ${args.compare} gives other bits than this build`);
    }
    const a: number[] = [], b: number[] = [];
    for (let i = 0; i < repeats; i++) {
      // A B, then B A: neither build always runs first.
      if (i % 2) b.push(await timeRun(other, otherBufs.prog));
      a.push(await timeRun(pool, prog));
      if (i % 2 === 0) b.push(await timeRun(other, otherBufs.prog));
    }
    const [ma, mb] = [median(a), median(b)];
    cells.push(`${cell(ma)} vs ${cell(mb)} (${(mb / ma).toFixed(2)}x)`);
  }
  const bw = await readBandwidth(heap, mineBufs.w, bytes, threads, repeats);
  console.log(
    `| ${type} | ${N} × ${K} | ${(bytes / 2 ** 20).toFixed(1)} | ${cells.join(" | ")} | ${
      (bw / 1e9).toFixed(1)
    } |`,
  );
  mineBufs.free();
  otherBufs?.free();
}
pool.close();
other?.close();
