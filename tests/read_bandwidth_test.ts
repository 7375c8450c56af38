/** The read-bandwidth probe the CPU bench prints as the decode limit. */
import { assert, assertRejects } from "@std/assert";
import { readBandwidth } from "../kernels/wasm/read_bandwidth.ts";
import { wasmHeap } from "../kernels/wasm/heap.ts";

Deno.test("read bandwidth: a sweep over 4 MiB on 1 and 2 threads gives a finite rate above 100 MB/s; under 64 bytes is refused by name", async () => {
  const heap = wasmHeap();
  const bytes = 4 << 20;
  const p = heap.alloc(bytes, "test range");
  try {
    for (const threads of [1, 2]) {
      const bw = await readBandwidth(heap, p, bytes, threads, 2);
      assert(Number.isFinite(bw) && bw > 1e8, `${threads} threads: ${bw} bytes/s`);
    }
    await assertRejects(
      () => readBandwidth(heap, p, 32, 1),
      Error,
      "over 32 bytes: need at least 64",
    );
  } finally {
    heap.free(p, bytes);
  }
});
