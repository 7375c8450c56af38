/**
 * The benchmarks in a tiny configuration (seconds), so their code keeps working: bench/load.ts
 * against a real server over both APIs, and every section of bench/compare.ts. Plus the
 * statistics they report, against hand-computed values.
 */
import {
  assert,
  assertEquals,
  assertGreater,
  assertLessOrEqual,
  assertStringIncludes,
  assertThrows,
} from "@std/assert";
import { batchBenchTable, runBatchBench } from "../bench/batch_bench.ts";
import { runCompare, sectionOptions } from "../bench/compare.ts";
import { type BatchingResult, compareBatching } from "../bench/compare_batching.ts";
import { engineRestarts, loadBenchModel } from "../bench/compare_common.ts";
import { parseLoadArgs, runLoad } from "../bench/load.ts";
import { cacheTable, repeatedWorkload, runCacheBench } from "../bench/result_cache_bench.ts";
import { percentile, summarize } from "../bench/stats.ts";
import { chartSvg, niceAxis } from "../bench/svg_chart.ts";
import {
  parseJsonlWorkload,
  parseLengthDist,
  poissonArrivals,
  seededRandom,
} from "../bench/workload.ts";
import { modelFile } from "./harness/model_files.ts";

Deno.test("percentile() is nearest-rank and summarize() reports it", () => {
  const v = [15, 20, 35, 40, 50]; // the textbook nearest-rank example
  assertEquals(percentile(v, 30), 20);
  assertEquals(percentile(v, 40), 20);
  assertEquals(percentile(v, 50), 35);
  assertEquals(percentile(v, 100), 50);
  const s = summarize([3, 1, 2, 4]);
  assertEquals([s.n, s.mean, s.p50, s.p90, s.p99, s.max], [4, 2.5, 2, 4, 4, 4]);
  assert(Number.isNaN(summarize([]).p50));
});

Deno.test("workload helpers: length ranges, Poisson gaps, JSONL files", () => {
  assertEquals(parseLengthDist("128", "x"), { min: 128, max: 128 });
  assertEquals(parseLengthDist("16-64", "x"), { min: 16, max: 64 });
  assertThrows(() => parseLengthDist("64-16", "output-tokens"), Error, "--output-tokens");
  // Mean gap of a Poisson process at rate r is 1/r: 4000 draws at 20/s average 50 ms (±5%).
  const t = poissonArrivals(4000, 20, seededRandom(3));
  const meanGap = t.at(-1)! / (t.length - 1);
  assert(Math.abs(meanGap - 50) < 2.5, `mean gap ${meanGap}`);
  const items = parseJsonlWorkload(
    '{"prompt":"a","max_tokens":3}\n\n{"messages":[{"role":"user","content":"b"}]}\n',
    "w.jsonl",
    9,
  );
  assertEquals(items, [{ prompt: "a", maxTokens: 3 }, {
    messages: [{ role: "user", content: "b" }],
    maxTokens: 9,
  }]);
  assertThrows(() => parseJsonlWorkload('{"prompt":1}', "w.jsonl", 9), Error, "w.jsonl:1");
});

Deno.test("chartSvg() draws one path per series with its points, on a nice axis", () => {
  assertEquals(niceAxis(870), { top: 1000, step: 200 });
  const svg = chartSvg([{
    title: "T",
    xLabel: "x",
    yLabel: "y",
    x: [1, 8],
    series: [{ name: "a", values: [1, 2] }, { name: "b", values: [3, null] }],
  }]);
  assert(svg.startsWith("<svg") && svg.trimEnd().endsWith("</svg>"));
  assertEquals(svg.match(/<path /g)?.length, 2);
  assertEquals(svg.match(/<circle /g)?.length, 3);
});

Deno.test("bench/load.ts runs closed-loop levels over WebSocket and HTTP against a real server and writes JSON and SVG", async () => {
  const out = await Deno.makeTempDir({ prefix: "bench_load_" });
  const report = await runLoad({
    backends: ["cpu"],
    model: modelFile("stories260K-ctx512.gguf"),
    apis: ["ws", "http"],
    concurrency: [1, 3],
    rates: [],
    requests: 4,
    promptTokens: { min: 8, max: 16 },
    outputTokens: { min: 6, max: 6 },
    temperature: 0,
    seed: 1,
    warmup: 1,
    serverArgs: ["--kv-memory", "2MiB"],
    outDir: out,
    log: () => {},
  });
  assertEquals(report.runs.map((r) => `${r.backend}/${r.api}`), ["cpu/ws", "cpu/http"]);
  for (const run of report.runs) {
    assertEquals(run.levels.map((l) => l.level), [1, 3]);
    for (const l of run.levels) {
      assertEquals([l.requests, l.completed, l.errors], [4, 4, {}]);
      // max_tokens 6 and EOS: each output has 1..6 tokens; prompts were cut to at most 16.
      assert(l.outputTokens >= 4 && l.outputTokens <= 24, `${l.outputTokens} output tokens`);
      assertLessOrEqual(l.promptTokensMean, 16);
      assertGreater(l.outputTokensPerSecond, 0);
      assert(l.ttftMs.p50 <= l.e2eMs.p50, "first token before the end");
    }
  }
  assertStringIncludes(report.markdown, "| cpu ");
  const json = JSON.parse(await Deno.readTextFile(`${out}/load.json`));
  assertEquals(json.runs.length, 2);
  const svg = await Deno.readTextFile(`${out}/load.svg`);
  assertEquals(svg.match(/<path /g)?.length, 2 + 4); // throughput per run; e2e and TTFT per run
  await Deno.remove(out, { recursive: true });
});

/** The same trace and seeds: static batching yields the same tokens and useful rows. */
function assertStaticMatchesContinuous(b: BatchingResult): void {
  assert(b.sameTokens);
  assertEquals(b.continuous.outputTokens, b.static.outputTokens);
  assertEquals(b.continuous.paddingRows, 0);
  assertEquals(b.static.computedRows - b.static.paddingRows, b.continuous.computedRows);
}

Deno.test("compareBatching() with static batching replayed in logical time: the same tokens, with padding on top", async () => {
  const bm = await loadBenchModel(modelFile("stories260K-ctx512.gguf"));
  // 8 arrivals 25 ms apart on average, and 4 to 16 steps of 5 logical ms per batch: later
  // arrivals queue behind a running batch, so static batches hold several prompts and pad.
  const o = { ...sectionOptions({ backend: "cpu", seed: 1, quick: true }).batching };
  assertEquals([o.requests, o.ratePerSecond, o.outputTokens], [8, 40, { min: 4, max: 16 }]);
  const b = await compareBatching(bm, { ...o, logicalStepMs: 5 });
  assertStaticMatchesContinuous(b);
  assertGreater(b.static.paddingRows, 0);
  assertStringIncludes(b.markdown, "logical clock, 5 ms a step");
});

Deno.test("bench/compare.ts runs every section in its quick configuration", async () => {
  const report = await runCompare({
    model: modelFile("stories260K-ctx512.gguf"),
    backend: "cpu",
    sections: ["batching", "kv", "prefix", "priority", "llama-cpp"],
    seed: 1,
    quick: true,
    llamaCpp: {
      parallel: [1, 2],
      tokens: 8,
      prompt: "Once upon a time",
      temperature: 0.8,
      repeats: 1,
      threads: 1,
      backends: ["cpu"],
      skipLlamaCpp: true,
    },
    outDir: null,
    log: () => {},
  });
  // A restart here (with no faults injected) is a scheduler/engine disagreement, not noise.
  assertEquals(engineRestarts(), 0, "engine restarts during the compare run");
  // On the wall clock, whether static batches pad depends on the machine's speed (arrivals
  // overlap only if a batch is still running); the useful rows and the tokens do not.
  assertStaticMatchesContinuous(report.batching!);
  const kv = report.kv!;
  assert(kv.pagedUtilisation > 0 && kv.pagedUtilisation <= 1);
  assertGreater(kv.pagedUtilisation, kv.contiguousMaxUtilisation);
  assertEquals(kv.contiguousMaxFit, 1);
  const p = report.prefix!;
  assert(p.sameOutputs);
  assertEquals(p.off.cachedTokens, 0);
  // Every prompt token is either computed or taken from the cache.
  assertEquals(p.on.prefillRows + p.on.cachedTokens, p.on.promptTokens);
  assertEquals(p.off.prefillRows, p.off.promptTokens);
  // How many batch requests finish inside the interactive window depends on the machine's
  // speed; what the run guarantees is its barrier: the window opens only after a batch request
  // finished, and every interactive request is answered on both sides.
  for (const side of [report.priority!.on, report.priority!.off]) {
    assertEquals(side.interactiveTtftMs.n, report.priority!.options.interactiveRequests);
    assertGreater(side.batchOutputTokensPerSecond, 0);
  }
  const l = report.llamaCpp!;
  assertEquals(l.ours.map((r) => [r.parallel, r.tokens]), [[1, 8], [2, 16]]);
  assertStringIncludes(l.unavailable["node-llama-cpp"]!, "skipped");
  for (
    const title of [
      "Continuous vs static",
      "Paged KV",
      "Prefix caching",
      "priority",
      "node-llama-cpp",
    ]
  ) {
    assertStringIncludes(report.markdown, title);
  }
});

Deno.test("bench/result_cache_bench.ts runs the repeated workload with the cache off and on, and the answers agree", async () => {
  assertEquals(repeatedWorkload(3, 2, 5).map((w) => w.prompt), [
    "Once upon a time",
    "The little dog",
    "Lily and Tom went to the park",
    "Once upon a time",
    "The little dog",
    "Lily and Tom went to the park",
  ]);
  const { off, on } = await runCacheBench({
    prompts: 2,
    repeats: 3,
    concurrency: 1,
    tokens: 8,
    backend: "cpu",
    cacheBytes: "1MiB",
  });
  // Sequential: the first round misses, every repeat hits.
  assertEquals([off.hits, off.misses], [0, 0]);
  assertEquals([on.hits, on.misses], [4, 2]);
  assertStringIncludes(cacheTable(off, on), "on / off");
});

Deno.test("bench/batch_bench.ts measures interactive TTFT alone and beside a running batch", async () => {
  const rows = await runBatchBench({
    levels: [2],
    backend: "reference",
    clients: 2,
    requestsPerClient: 2,
    // Batch rows yield to interactive prefills, so the clients think long enough (mean 50 ms)
    // for a few short lines to finish beside them.
    thinkMs: 50,
    rounds: 2,
    interactiveMaxTokens: 4,
    batchLines: 100,
    batchMaxTokens: 8,
  });
  assertEquals(rows.length, 1);
  const row = rows[0]!;
  assertEquals(row.errors, 0);
  // Two clients, two requests each, in each phase of two rounds.
  assertEquals([row.alone.n, row.withBatch.n], [8, 8]);
  assertGreater(row.batchLinesPerSecond, 0);
  assertStringIncludes(batchBenchTable(rows), "p99 ratio");
});

Deno.test("bench/load.ts hands every --server-arg's flags to the servers it starts, and refuses an argument it does not know", () => {
  const opts = parseLoadArgs([
    "--server-arg",
    "--pipeline-depth 8",
    "--server-arg=--max-running 64",
    "--backend",
    "webgpu",
  ]);
  assertEquals(opts.serverArgs, ["--pipeline-depth", "8", "--max-running", "64"]);
  assertEquals(opts.backends, ["webgpu"]);
  assertThrows(() => parseLoadArgs(["--concurency", "8"]), Error, '"--concurency"');
});
