import { CTRL, SCRATCH_BYTES } from "./pool_protocol.ts";
import type { WasmHeap } from "./heap.ts";

/**
 * Worker threads over the shared memories of one engine: tensor parallelism across cores. Every program runs
 * on all threads at once, each taking its share of every op's output rows (never of a
 * reduction, so results do not depend on the thread count). The main thread only starts a
 * program and awaits its end, so it stays free for HTTP while a step computes.
 */
export class ThreadPool {
  readonly #workers: Worker[];
  readonly #words: Int32Array;
  #pending: { resolve: () => void; reject: (e: Error) => void } | undefined;
  #broken: string | undefined;
  #closed = false;

  readonly #memories: number;

  private constructor(heap: WasmHeap, ctrl: number, workers: Worker[], memories: number) {
    this.#workers = workers;
    this.#memories = memories;
    this.#words = heap.i32(ctrl, CTRL.words);
    for (const w of workers) {
      w.onmessage = (e: MessageEvent) => {
        const m = e.data as { type: string; message?: string; tid?: number };
        if (m.type === "done") {
          const p = this.#pending;
          this.#pending = undefined;
          if (this.#broken) p?.reject(new Error(this.#broken));
          else p?.resolve();
        } else if (m.type === "error") {
          this.#broken = `CPU engine thread ${m.tid} failed: ${m.message}`;
          const p = this.#pending;
          this.#pending = undefined;
          p?.reject(new Error(this.#broken));
        }
      };
      w.onerror = (e) => {
        e.preventDefault();
        this.#broken = `CPU engine thread failed: ${e.message}`;
        this.#pending?.reject(new Error(this.#broken));
        this.#pending = undefined;
      };
    }
  }

  get threads(): number {
    return this.#workers.length;
  }

  /** Starts `threads` workers, each with an instance of `module` over every heap in `heaps`. */
  static async start(
    heaps: WasmHeap | readonly WasmHeap[],
    module: WebAssembly.Module,
    threads: number,
  ): Promise<ThreadPool> {
    if (!(Number.isInteger(threads) && threads >= 1 && threads <= 256)) {
      throw new Error(
        `Cannot start the CPU engine: threads must be an integer in 1..256, received ${threads}`,
      );
    }
    const all = Array.isArray(heaps) ? heaps as readonly WasmHeap[] : [heaps as WasmHeap];
    const ctrlBytes = CTRL.bytes + threads * SCRATCH_BYTES;
    const ctrls = all.map((h) => {
      const at = h.alloc(ctrlBytes, "thread pool control words");
      h.u8(at, CTRL.bytes).fill(0);
      return at;
    });
    const heap = all[0]!, ctrl = ctrls[0]!;
    const workers: Worker[] = [];
    const ready: Promise<void>[] = [];
    for (let tid = 0; tid < threads; tid++) {
      const w = new Worker(new URL("./worker.ts", import.meta.url).href, { type: "module" });
      workers.push(w);
      ready.push(
        new Promise((resolve, reject) => {
          w.onmessage = (e) => (e.data as { type: string }).type === "ready" && resolve();
          w.onerror = (e) => {
            e.preventDefault();
            reject(new Error(`Cannot start CPU engine thread ${tid}: ${e.message}`));
          };
        }),
      );
      w.postMessage({ memories: all.map((h) => h.memory), module, ctrls, tid, nth: threads });
    }
    try {
      await Promise.all(ready);
    } catch (e) {
      for (const w of workers) w.terminate();
      all.forEach((h, i) => h.free(ctrls[i]!, ctrlBytes));
      throw e;
    }
    return new ThreadPool(heap, ctrl, workers, all.length);
  }

  /** Runs the program at `prog` in the pool's memory `mem` on every thread; one program at a time. */
  run(prog: number, mem = 0): Promise<void> {
    if (this.#closed) {
      return Promise.reject(new Error("Cannot run a program: the thread pool is closed"));
    }
    if (this.#broken) return Promise.reject(new Error(this.#broken));
    if (this.#pending) {
      return Promise.reject(new Error("Cannot run a program: the previous one has not finished"));
    }
    if (!(Number.isInteger(mem) && mem >= 0 && mem < this.#memories)) {
      return Promise.reject(
        new Error(`Cannot run a program in memory ${mem}: the pool has ${this.#memories}`),
      );
    }
    const w = this.#words;
    return new Promise<void>((resolve, reject) => {
      this.#pending = { resolve, reject };
      Atomics.store(w, CTRL.prog, prog);
      Atomics.store(w, CTRL.mem, mem);
      Atomics.store(w, CTRL.done, 0);
      Atomics.add(w, CTRL.gen, 1);
      Atomics.notify(w, CTRL.gen);
    });
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    Atomics.store(this.#words, CTRL.stop, 1);
    Atomics.add(this.#words, CTRL.gen, 1);
    Atomics.notify(this.#words, CTRL.gen);
    // A thread stuck at a barrier after another's failure never sees the stop word.
    for (const w of this.#workers) w.terminate();
    this.#pending?.reject(new Error("The thread pool was closed during a program"));
    this.#pending = undefined;
    // The control words (and the threads' scratch) are not freed: a terminating thread may
    // still touch them.
  }
}
