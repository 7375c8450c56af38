/**
 * The similar-question index's lookup time: a brute-force cosine over N packed unit vectors of
 * one context (the worst case: every entry is compared), at the hidden sizes of the
 * Qwen2.5-0.5B (896) and Llama-3.1-8B (4096) shapes.
 *
 *   deno run -A bench/similar_index_bench.ts [--sizes 10000,100000] [--dims 896,4096]
 */
import { parseArgs } from "@std/cli/parse-args";
import { SimilarIndex } from "../lib/core/similar_index.ts";
import { machineInfo, machineLine } from "./machine.ts";
import { fmt, summarize } from "./stats.ts";
import { seededRandom } from "./workload.ts";

const a = parseArgs(Deno.args, { string: ["sizes", "dims"], default: { lookups: 20 } });
const sizes = (a.sizes ?? "10000,100000").split(",").map(Number);
const dims = (a.dims ?? "896,4096").split(",").map(Number);
const random = seededRandom(3);
const unit = (dim: number) => {
  const v = Float32Array.from({ length: dim }, () => random() - 0.5);
  const n = Math.hypot(...v);
  return v.map((x) => x / n);
};
console.log(machineLine(machineInfo()));
console.log(`\none context, median of ${a.lookups} lookups\n`);
console.log("| entries | dim | index MiB | lookup ms p50 | lookup ms max |");
console.log("|---:|---:|---:|---:|---:|");
for (const dim of dims) {
  for (const n of sizes) {
    const index = new SimilarIndex<number>(dim, 2 ** 40, () => 8);
    for (let i = 0; i < n; i++) index.add("ctx", unit(dim), i);
    const times: number[] = [];
    for (let q = 0; q < Number(a.lookups); q++) {
      const v = unit(dim);
      const t0 = performance.now();
      index.nearest("ctx", v);
      times.push(performance.now() - t0);
    }
    const s = summarize(times);
    console.log(
      `| ${n} | ${dim} | ${fmt(index.bytes / 2 ** 20)} | ${fmt(s.p50, 2)} | ${fmt(s.max, 2)} |`,
    );
  }
}
