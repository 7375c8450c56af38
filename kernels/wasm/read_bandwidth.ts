/**
 * The memory bandwidth a plain WASM SIMD read loop reaches over a range of the engine's memory,
 * on a pool of `threads`: the limit a 1-sequence decode step, which reads every weight once,
 * can approach (issue 35). The best of `repeats` sweeps, so a neighbour's burst is not counted.
 */
import type { WasmHeap } from "./heap.ts";
import { kernelModule } from "./kernel_module.ts";
import { ThreadPool } from "./pool.ts";
import { OP, OP_WORDS, ProgramWriter } from "./program.ts";

/** Bytes/s of the fastest of `repeats` sweeps over [base, base + bytes) (rounded down to 64). */
export async function readBandwidth(
  heap: WasmHeap,
  base: number,
  bytes: number,
  threads: number,
  repeats = 5,
): Promise<number> {
  const units = Math.floor(bytes / 64);
  if (units < 1) {
    throw new Error(`Cannot measure read bandwidth over ${bytes} bytes: need at least 64`);
  }
  const pool = await ThreadPool.start(heap, kernelModule().module, threads);
  const progBytes = 2 * OP_WORDS * 4, sinkBytes = 16 * threads;
  const prog = heap.alloc(progBytes, "the read sweep's program");
  const sink = heap.alloc(sinkBytes, "the read sweep's sink");
  try {
    new ProgramWriter(heap.i32(prog, 2 * OP_WORDS)).op(OP.readSweep, [base, units, sink]).end();
    await pool.run(prog); // warm-up: the loop reaches V8's optimising tier
    let best = Infinity;
    for (let i = 0; i < repeats; i++) {
      const t0 = performance.now();
      await pool.run(prog);
      best = Math.min(best, performance.now() - t0);
    }
    return (units * 64) / (best / 1000);
  } finally {
    pool.close();
    heap.free(prog, progBytes);
    heap.free(sink, sinkBytes);
  }
}
