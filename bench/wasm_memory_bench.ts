/**
 * Why the CPU engine splits a model over several wasm32 memories rather than using one
 * 64-bit memory (docs/engines.md, "The CPU engine"), measured:
 *
 * 1. A plain SIMD read loop (four v128 loads a 64-byte line, summed) over 512 MiB in a wasm32
 *    memory and in a memory64 one (`address: "i64"`), one thread, alternating, best pass of
 *    each. The loop is hand-written text assembled by binaryen (AssemblyScript 0.28 cannot emit
 *    memory64: its `--enable memory64` is a no-op and the module still imports an i32 memory).
 * 2. The engine's own Q4_K matmul kernel over the same 256 MiB matrix (one activation row, a
 *    decode), in the first and the second memory of one pool, as a split model runs it.
 *
 *   deno run -A bench/wasm_memory_bench.ts [--threads 2] [--rounds 3]
 */
import { parseArgs } from "@std/cli/parse-args";
import binaryen from "binaryen";
import { WasmHeap } from "../kernels/wasm/heap.ts";
import { ThreadPool } from "../kernels/wasm/pool.ts";
import { kernelModule } from "../kernels/wasm/kernel_module.ts";
import { ActBuffer } from "../kernels/wasm/act_buffer.ts";
import { OP, OP_WORDS, ProgramWriter } from "../kernels/wasm/program.ts";
import { byteSize, TENSOR_TYPES } from "../lib/model/tensor.ts";

const args = parseArgs(Deno.args, {
  string: ["threads", "rounds"],
  default: { threads: "2", rounds: "3" },
});
const threads = Number(args.threads), rounds = Number(args.rounds);
const MiB = 2 ** 20;

function readLoop(a: "i32" | "i64"): WebAssembly.Module {
  const c = a;
  const text = `(module (import "env" "memory" (memory ${
    a === "i64" ? "i64 1 262144" : "1 65536"
  } shared))
  (func (export "sum") (param $p ${c}) (param $end ${c}) (result i32) (local $x v128) (local $y v128)
    (loop $l
      (local.set $x (i32x4.add (local.get $x) (v128.load (local.get $p))))
      (local.set $y (i32x4.add (local.get $y) (v128.load offset=16 (local.get $p))))
      (local.set $x (i32x4.add (local.get $x) (v128.load offset=32 (local.get $p))))
      (local.set $y (i32x4.add (local.get $y) (v128.load offset=48 (local.get $p))))
      (local.set $p (${c}.add (local.get $p) (${c}.const 64)))
      (br_if $l (${c}.lt_u (local.get $p) (local.get $end))))
    (i32x4.extract_lane 0 (i32x4.add (local.get $x) (local.get $y)))))`;
  const m = binaryen.parseText(text);
  m.setFeatures(binaryen.Features.All);
  if (!m.validate()) throw new Error(`The ${a} read loop does not validate`);
  return new WebAssembly.Module(m.emitBinary() as BufferSource);
}

/** GB/s of the best of `passes` passes over `bytes`, after a warm-up that tiers the loop up. */
function plainRead(a: "i32" | "i64", bytes: number, passes: number): number {
  const pages = bytes / 65536 + 1;
  const memory = a === "i64"
    ? new WebAssembly.Memory(
      {
        initial: BigInt(pages),
        maximum: 262144n,
        shared: true,
        address: "i64",
      } as unknown as WebAssembly.MemoryDescriptor,
    )
    : new WebAssembly.Memory({ initial: pages, maximum: 65536, shared: true });
  new Uint8Array(memory.buffer).fill(1, 0, bytes);
  const sum = new WebAssembly.Instance(readLoop(a), { env: { memory } }).exports.sum as (
    p: unknown,
    e: unknown,
  ) => number;
  const at = (x: number) => (a === "i64" ? BigInt(x) : x);
  for (let w = 0; w < 20000; w++) sum(at(0), at(65536));
  let best = Infinity;
  for (let r = 0; r < passes; r++) {
    const t = performance.now();
    sum(at(0), at(bytes));
    best = Math.min(best, performance.now() - t);
  }
  return bytes / best / 1e6;
}

/** GB/s of the Q4_K matmul kernel over an N×K matrix in each heap of one pool, best of `passes`. */
async function matmulRead(
  heaps: WasmHeap[],
  n: number,
  k: number,
  passes: number,
): Promise<number[]> {
  const pool = await ThreadPool.start(heaps, kernelModule().module, threads);
  const type = TENSOR_TYPES.indexOf("q4_k");
  const bytes = byteSize("q4_k", [n, k]);
  try {
    const progs = heaps.map((h) => {
      // Zero weights (d = 0): the kernel's work and reads are the same as for any values.
      const w = h.alloc(bytes, "bench weights");
      h.u8(w, bytes).fill(0);
      const act = new ActBuffer(h, 1, k, "bench activations");
      h.f32(act.f, k).fill(0.5);
      const out = h.alloc(n * 4, "bench outputs");
      const prog = h.alloc(4 * OP_WORDS * 4, "bench program");
      const pw = new ProgramWriter(h.i32(prog, 4 * OP_WORDS));
      pw.op(OP.quant, [act.desc, 1, k]);
      pw.op(OP.matmul, [type, w, n, k, act.desc, 1, out, n, 0, 0]);
      pw.end();
      return prog;
    });
    const best = heaps.map(() => Infinity);
    for (let r = 0; r < passes; r++) {
      for (let m = 0; m < heaps.length; m++) {
        const t = performance.now();
        await pool.run(progs[m]!, m);
        best[m] = Math.min(best[m]!, performance.now() - t);
      }
    }
    return best.map((ms) => bytes / ms / 1e6);
  } finally {
    pool.close();
  }
}

const f2 = (x: number) => x.toFixed(1);
const plain: Record<"i32" | "i64", number[]> = { i32: [], i64: [] };
for (let r = 0; r < rounds; r++) {
  for (const a of ["i32", "i64"] as const) plain[a].push(plainRead(a, 512 * MiB, 8));
}
const heaps = [new WasmHeap(), new WasmHeap()];
// 256 MiB of Q4_K: 14336 x 4096 weights (Llama-3.1-8B's ffn_gate) is 33 MB; 8 of them.
const mm = await matmulRead(heaps, 14336 * 8, 4096, 4 * rounds);
console.log(`| what | GB/s |\n|---|---:|`);
console.log(
  `| plain read loop, wasm32 memory, 1 thread (each of ${rounds} rounds) | ${
    plain.i32.map(f2).join(", ")
  } |`,
);
console.log(
  `| plain read loop, memory64, 1 thread (each of ${rounds} rounds) | ${
    plain.i64.map(f2).join(", ")
  } |`,
);
console.log(`| Q4_K matmul, 1 row, ${threads} threads, first memory of the pool | ${f2(mm[0]!)} |`);
console.log(
  `| Q4_K matmul, 1 row, ${threads} threads, second memory of the pool | ${f2(mm[1]!)} |`,
);
