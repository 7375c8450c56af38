/// <reference lib="deno.worker" />
/**
 * One thread of the CPU engine's pool: instantiates the kernels over each of the shared
 * memories, then runs each program the pool starts in the memory it names (pool.ts has the
 * protocol), blocking in Atomics.wait between steps.
 */
import { CTRL, SCRATCH_BYTES } from "./pool_protocol.ts";

self.onmessage = (e: MessageEvent) => {
  const { memories, module, ctrls, tid, nth } = e.data as {
    memories: WebAssembly.Memory[];
    module: WebAssembly.Module;
    ctrls: number[];
    tid: number;
    nth: number;
  };
  type Run = (prog: number, ctrl: number, tid: number, n: number, scratch: number) => void;
  const runs: Run[] = memories.map((memory) => {
    const instance = new WebAssembly.Instance(module, { env: { memory } });
    const scratchBytes = (instance.exports.scratchBytes as () => number)();
    if (scratchBytes !== SCRATCH_BYTES) {
      throw new Error(
        `The kernels want ${scratchBytes} bytes of scratch per thread, the pool gives ${SCRATCH_BYTES}`,
      );
    }
    return instance.exports.run as Run;
  });
  const words = new Int32Array(memories[0]!.buffer, ctrls[0]!, CTRL.words);
  self.postMessage({ type: "ready", tid });
  let seen = 0;
  for (;;) {
    Atomics.wait(words, CTRL.gen, seen);
    const gen = Atomics.load(words, CTRL.gen);
    if (gen === seen) continue;
    seen = gen;
    if (Atomics.load(words, CTRL.stop) !== 0) break;
    try {
      const m = Atomics.load(words, CTRL.mem), ctrl = ctrls[m]!;
      runs[m]!(
        Atomics.load(words, CTRL.prog),
        ctrl + CTRL.barrierOffset,
        tid,
        nth,
        ctrl + CTRL.bytes + tid * SCRATCH_BYTES,
      );
    } catch (err) {
      // The other threads may now wait at a barrier for good: the pool is unusable and says so.
      self.postMessage({
        type: "error",
        tid,
        message: err instanceof Error ? err.message : String(err),
      });
    }
    if (Atomics.add(words, CTRL.done, 1) === nth - 1) self.postMessage({ type: "done", gen });
  }
  self.close();
};
