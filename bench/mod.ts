/**
 * `deno task bench`: every in-process benchmark in one run, as markdown tables — the
 * scheduler's CPU cost, the WebGPU kernels and steps, and throughput scaling of the whole core.
 * The service-level benchmarks (`bench:load`, `bench:compare`) start a server and have their own
 * tasks.
 *
 *   MODEL_MIRROR=../shared/models deno task bench
 */
import { measure } from "./scheduler_bench.ts";
import { runKernelsBench } from "./kernels_bench.ts";
import { markdownTable } from "./markdown_table.ts";
import { runThroughputBench, throughputTable } from "./throughput_bench.ts";

console.log(`# llmserve benchmarks, ${new Date().toISOString()}\n`);

console.log("## Scheduler CPU cost per iteration (fake engine excluded), 2000 iterations\n");
console.log(markdownTable(
  ["running", "avg batch", "median µs", "p99 µs"],
  [1, 64, 256].map((n) => measure(n, 2000)).map((r) => [
    String(r.running),
    r.avgBatch.toFixed(1),
    r.medianUs.toFixed(1),
    r.p99Us.toFixed(1),
  ]),
));

console.log("## WebGPU kernels and steps, stories260K\n");
await runKernelsBench(["--steps", "48"]);

console.log("\n## Throughput scaling, stories260K, 128 greedy tokens per generation\n");
console.log(throughputTable(
  await runThroughputBench({
    tokens: 128,
    concurrency: [1, 8, 32, 64],
    backends: ["webgpu", "cpu"],
  }),
));
