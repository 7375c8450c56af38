/**
 * Word indices of a pool's control block (Int32Array over CTRL.bytes at its address). Every
 * memory of the pool has such a block, for its barrier and the threads' scratch; the first
 * memory's also carries the words that start and end programs.
 */
export const CTRL = {
  /** Bumped by the main thread to start a program (workers wait on it). */
  gen: 0,
  /** Address of the program to run. */
  prog: 1,
  /** Threads finished with the current program. */
  done: 2,
  /** Non-zero: workers exit at the next wake-up. */
  stop: 3,
  /** Which of the pool's memories the program is in (its index in the pool's heaps). */
  mem: 4,
  words: 16,
  bytes: 64,
  /** The barrier's two words (count, generation) start here, in bytes. */
  barrierOffset: 32,
} as const;

/**
 * Bytes of scratch each thread owns, after the control block: scratchBytes() of
 * kernels/wasm/as/program.ts (the legacy kernels' 4 KiB and the prefill GEMM's 128 KiB of
 * unpacked weight rows), which the worker checks.
 */
export const SCRATCH_BYTES = 4096 + (128 << 10);
