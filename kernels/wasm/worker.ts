/// <reference lib="deno.worker" />
/**
 * One thread of the CPU engine's pool: instantiates the kernels over the shared memory, then
 * runs each program the pool starts (pool.ts has the protocol), blocking in Atomics.wait
 * between steps.
 */
import { CTRL, SCRATCH_BYTES } from "./pool_protocol.ts";

self.onmessage = (e: MessageEvent) => {
  const { memory, module, ctrl, tid, nth } = e.data as {
    memory: WebAssembly.Memory;
    module: WebAssembly.Module;
    ctrl: number;
    tid: number;
    nth: number;
  };
  const instance = new WebAssembly.Instance(module, { env: { memory } });
  const run = instance.exports.run as (prog: number, ctrl: number, tid: number, n: number, scratch: number) => void;
  const scratchBytes = (instance.exports.scratchBytes as () => number)();
  if (scratchBytes !== SCRATCH_BYTES) {
    throw new Error(`The kernels want ${scratchBytes} bytes of scratch per thread, the pool gives ${SCRATCH_BYTES}`);
  }
  const scratch = ctrl + CTRL.bytes + tid * SCRATCH_BYTES;
  const words = new Int32Array(memory.buffer, ctrl, CTRL.words);
  self.postMessage({ type: "ready", tid });
  let seen = 0;
  for (;;) {
    Atomics.wait(words, CTRL.gen, seen);
    const gen = Atomics.load(words, CTRL.gen);
    if (gen === seen) continue;
    seen = gen;
    if (Atomics.load(words, CTRL.stop) !== 0) break;
    try {
      run(Atomics.load(words, CTRL.prog), ctrl + CTRL.barrierOffset, tid, nth, scratch);
    } catch (err) {
      // The other threads may now wait at a barrier for good: the pool is unusable and says so.
      self.postMessage({ type: "error", tid, message: err instanceof Error ? err.message : String(err) });
    }
    if (Atomics.add(words, CTRL.done, 1) === nth - 1) self.postMessage({ type: "done", gen });
  }
  self.close();
};
