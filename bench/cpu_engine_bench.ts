/**
 * The CPU engine against llama.cpp on the same GGUF files, in the same run:
 * `llama-batched-bench -npp 16 -ntg 32 -npl 1,8,32 -t <threads>` on llama.cpp's side, and the
 * same shape on ours (npl prompts of npp tokens prefilled together, then ntg decode steps of
 * all npl sequences). Prints decode and prefill tokens/s with the ratio, our resident memory
 * after load with its breakdown, 1 against N threads at the largest batch, and writes an SVG
 * chart of decode tokens/s against concurrency. Prints the limit a 1-sequence decode can reach:
 * the bandwidth of a plain WASM SIMD read loop over the loaded weights on 1 and N threads, beside
 * the bytes/s our 1-sequence decode reads (the matrices of one step, times its tokens/s). Each file runs in a process of its own (so the
 * memory figures are its alone), in --repeats rounds (default 3) that alternate the two sides,
 * each side keeping its best.
 *
 *   deno run -A bench/cpu_engine_bench.ts --llama-cpp /tmp/llama.cpp/build/bin \
 *     --model /tmp/perf/qwen25-05b-q4_k_m.gguf --model /tmp/perf/llama32-1b-q4_k_m.gguf
 *
 * llama.cpp is built as ../shared/models/perf/README.md says (without AMX). Without
 * --llama-cpp, only our side is measured and the table says so.
 */
import { parseArgs } from "@std/cli/parse-args";
import { loadModel } from "../lib/model/load_model.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { wasmHeap } from "../kernels/wasm/heap.ts";
import { placeInHeaps } from "../kernels/wasm/tensor_placement.ts";
import { GREEDY, type SeqInput } from "../lib/engine/engine.ts";
import { formatBytes } from "../lib/util/byte_size.ts";
import { chartSvg } from "./svg_chart.ts";
import { readBandwidth } from "../kernels/wasm/read_bandwidth.ts";
import { stepMatrixBytes } from "../lib/model/weights.ts";

interface Row {
  readonly npl: number;
  readonly pp: number; // prefill tokens/s
  readonly tg: number; // decode tokens/s
}

const args = parseArgs(Deno.args, {
  string: ["model", "llama-cpp", "npl", "threads", "npp", "ntg", "svg", "repeats"],
  boolean: ["chart-data", "skip-one-thread"],
  collect: ["model"],
  default: {
    npl: "1,8,32",
    threads: String(navigator.hardwareConcurrency),
    npp: "16",
    ntg: "32",
    repeats: "3",
  },
});
const models = (args.model ?? []) as string[];
if (models.length === 0) {
  console.error(
    "Usage: deno run -A bench/cpu_engine_bench.ts --model <gguf> [--model …] [--llama-cpp <bin dir>] [--npl 1,8,32] [--threads N] [--repeats 3] [--skip-one-thread] [--svg <file>]",
  );
  Deno.exit(2);
}
const npls: number[] = String(args.npl).split(",").map(Number);
const threads = Number(args.threads);
const npp = Number(args.npp), ntg = Number(args.ntg);
const repeats = Number(args.repeats);

/** Our side: one engine per file, every concurrency in turn. */
async function ours(engine: WasmEngine, vocab: number, npl: number): Promise<Row> {
  const bs = engine.kv.blockSize;
  const per = Math.ceil((npp + ntg + 1) / bs);
  const prompts = Array.from(
    { length: npl },
    (_, i) => Array.from({ length: npp }, (_, j) => (17 + 31 * i + 7 * j) % vocab),
  );
  const seqs = (tokens: number[][], pos: number): SeqInput[] =>
    tokens.map((t, i) => ({
      seqId: i,
      tokens: t,
      startPos: pos,
      blockTable: Array.from({ length: per }, (_, b) => i * per + b),
      sample: true,
      sampling: GREEDY,
    }));
  const t0 = performance.now();
  let r = await engine.step({ stepId: 0, seqs: seqs(prompts, 0) });
  const tPrefill = performance.now() - t0;
  const t1 = performance.now();
  for (let s = 0; s < ntg; s++) {
    r = await engine.step({ stepId: 1 + s, seqs: seqs(r.sampled.map((x) => [x.token]), npp + s) });
  }
  const tDecode = performance.now() - t1;
  for (let i = 0; i < npl; i++) engine.release(i);
  return { npl, pp: (npl * npp * 1000) / tPrefill, tg: (npl * ntg * 1000) / tDecode };
}

/** llama.cpp's side: llama-batched-bench's markdown table, S_PP and S_TG per batch. */
async function llamaCpp(bin: string, model: string): Promise<Row[]> {
  const out = await new Deno.Command(`${bin}/llama-batched-bench`, {
    args: [
      "-m",
      model,
      "-c",
      "8192",
      "-b",
      "2048",
      "-ub",
      "512",
      "-npp",
      String(npp),
      "-ntg",
      String(ntg),
      "-npl",
      npls.join(","),
      "-t",
      String(threads),
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  if (!out.success) {
    throw new Error(
      `llama-batched-bench failed: ${new TextDecoder().decode(out.stderr).slice(-500)}`,
    );
  }
  const rows: Row[] = [];
  for (const line of text.split("\n")) {
    const cells = line.split("|").map((c) => c.trim()).filter((c) => c !== "");
    if (cells.length >= 8 && /^\d+$/.test(cells[0]!) && Number(cells[0]) === npp) {
      rows.push({ npl: Number(cells[2]), pp: Number(cells[5]), tg: Number(cells[7]) });
    }
  }
  return rows;
}

const f1 = (x: number) => x.toFixed(1);
const lines: string[] = [];
type Chart = { title: string; x: number[]; series: { name: string; values: (number | null)[] }[] };
const chart: Chart[] = [];
const CHART_LINE = "chart-data: ";
// One process per file: the resident-memory figures are then this file's alone.
const perProcess = models.length > 1;
if (perProcess) {
  const self = new URL(import.meta.url).pathname;
  const rest = Deno.args.filter((a, i, all) =>
    a !== "--model" && all[i - 1] !== "--model" && !a.startsWith("--model=") && a !== "--svg" &&
    all[i - 1] !== "--svg" && !a.startsWith("--svg=")
  );
  for (const path of models) {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", self, ...rest, "--model", path, "--chart-data"],
      stdout: "piped",
      stderr: "inherit",
    }).output();
    if (!out.success) throw new Error(`The run on ${path} failed (exit ${out.code})`);
    for (const line of new TextDecoder().decode(out.stdout).split("\n")) {
      if (line.startsWith(CHART_LINE)) chart.push(JSON.parse(line.slice(CHART_LINE.length)));
      else lines.push(line);
    }
  }
}
const heap = wasmHeap();
for (const path of perProcess ? [] : models) {
  const name = path.split("/").pop()!;
  const fileBytes = (await Deno.stat(path)).size;
  const rssBefore = Deno.memoryUsage().rss;
  // A file too big for one WebAssembly memory is read tensor by tensor into several.
  const model = await loadModel(path, {
    allocate: (n) => heap.bytes(n, "the model's weights"),
    placeTensors: (tensors) => placeInHeaps(tensors),
  });
  const maxNpl = Math.max(...npls);
  const per = Math.ceil((npp + ntg + 1) / 16);
  const kv = { numBlocks: maxNpl * per, blockSize: 16 };
  const engine = await WasmEngine.create(model.config, model.weights, kv, {
    threads,
    maxSeqs: maxNpl,
    maxBatchTokens: Math.max(512, maxNpl * npp),
  });
  const rssLoaded = Deno.memoryUsage().rss;
  // A warm-up, as llama-batched-bench runs one: the kernels are compiled by V8 in tiers, the
  // optimised tier only after they have run a while.
  await ours(engine, model.config.vocabSize, 1);
  // Rounds alternate the two sides and each keeps its best per concurrency: this shared
  // machine's neighbours slow either side at times, and the best is the least disturbed.
  const best = (a: Row[], b: Row[]): Row[] =>
    a.length === 0 ? b : a.map((r) => {
      const o = b.find((x) => x.npl === r.npl);
      return o ? { npl: r.npl, pp: Math.max(r.pp, o.pp), tg: Math.max(r.tg, o.tg) } : r;
    });
  let mine: Row[] = [];
  let peer: Row[] = [];
  let why = args["llama-cpp"] ? "" : "no --llama-cpp given";
  for (let round = 0; round < repeats; round++) {
    const got: Row[] = [];
    for (const npl of npls) got.push(await ours(engine, model.config.vocabSize, npl));
    mine = best(mine, got);
    if (args["llama-cpp"] && !why) {
      try {
        peer = best(peer, await llamaCpp(args["llama-cpp"], path));
      } catch (e) {
        why = e instanceof Error ? e.message : String(e);
      }
    }
  }
  // The read loop over the weights as they lie in the engine's memory (the file's tensors).
  const tensors = [
    model.weights.tokenEmbedding,
    model.weights.output,
    ...model.weights.layers.flatMap((l) => Object.values(l)),
  ];
  const lo = Math.min(...tensors.map((t) => t.data.byteOffset));
  const hi = Math.max(...tensors.map((t) => t.data.byteOffset + t.data.byteLength));
  const readLimit: number[] = [];
  for (const n of [...new Set([1, threads])]) {
    readLimit.push(await readBandwidth(heap, lo, hi - lo, n, repeats + 2));
  }
  // After the runs: the KV pages the sequences wrote are resident now.
  const rssAfter = Deno.memoryUsage().rss;
  engine.dispose();
  const one = await WasmEngine.create(model.config, model.weights, kv, {
    threads: 1,
    maxSeqs: maxNpl,
    maxBatchTokens: Math.max(512, maxNpl * npp),
  });
  // --skip-one-thread: the 1-thread comparison costs as much as the runs themselves.
  let single = args["skip-one-thread"]
    ? { npl: maxNpl, pp: NaN, tg: NaN }
    : await ours(one, model.config.vocabSize, maxNpl);
  for (let round = 1; round < repeats && !args["skip-one-thread"]; round++) {
    single = best([single], [await ours(one, model.config.vocabSize, maxNpl)])[0]!;
  }
  one.dispose();
  lines.push(
    `\n### ${name} (${
      formatBytes(fileBytes)
    }), ${threads} threads, npp ${npp}, ntg ${ntg}, best of ${repeats} alternating rounds\n`,
  );
  lines.push(
    "| sequences | ours decode tok/s | llama.cpp decode tok/s | ratio | ours prefill tok/s | llama.cpp prefill tok/s | ratio |",
  );
  lines.push("|---:|---:|---:|---:|---:|---:|---:|");
  for (const m of mine) {
    const p = peer.find((r) => r.npl === m.npl);
    lines.push(
      `| ${m.npl} | ${f1(m.tg)} | ${p ? f1(p.tg) : "–"} | ${
        p ? (m.tg / p.tg).toFixed(2) + "×" : "–"
      } | ${f1(m.pp)} | ${p ? f1(p.pp) : "–"} | ${p ? (m.pp / p.pp).toFixed(2) + "×" : "–"} |`,
    );
  }
  if (why) lines.push(`\nllama.cpp not measured: ${why}`);
  const one1 = mine.find((m) => m.npl === 1);
  const stepBytes = stepMatrixBytes(model.weights);
  const gbs = (b: number) => `${(b / 1e9).toFixed(1)} GB/s`;
  lines.push(
    `\nRead bandwidth, the limit (a plain WASM SIMD read loop over the ${
      formatBytes(hi - lo)
    } of weights, best of ${repeats + 2}): ` +
      `1 thread ${gbs(readLimit[0]!)}${
        readLimit.length > 1 ? `, ${threads} threads ${gbs(readLimit[1]!)}` : ""
      }.` +
      (one1
        ? ` 1-sequence decode reads ${formatBytes(stepBytes)} a token: ${
          gbs(stepBytes * one1.tg)
        } at ${f1(one1.tg)} tok/s, ` +
          `${
            ((100 * stepBytes * one1.tg) / readLimit[readLimit.length - 1]!).toFixed(0)
          }% of the ${threads}-thread limit.`
        : ""),
  );
  const big = mine.find((m) => m.npl === maxNpl)!;
  lines.push(
    `\nThreads at ${maxNpl} sequences: 1 thread ${f1(single.tg)} tok/s, ${threads} threads ${
      f1(big.tg)
    } tok/s: ${(big.tg / single.tg).toFixed(2)}×.`,
  );
  lines.push(
    `\nMemory: RSS ${formatBytes(rssBefore)} before load, ${
      formatBytes(rssLoaded)
    } after load and engine start, ${formatBytes(rssAfter)} after the runs; file ${
      formatBytes(fileBytes)
    }, KV cache ${formatBytes(engine.memory.kvCache)} (${kv.numBlocks} blocks, f16), step buffers ${
      formatBytes(engine.memory.buffers)
    }, ${engine.memories} WebAssembly ${
      engine.memories === 1 ? "memory" : "memories"
    }; after load − file − KV = ${formatBytes(rssLoaded - fileBytes - engine.memory.kvCache)}.`,
  );
  (args["chart-data"]
    ? (c: Chart) => lines.push(CHART_LINE + JSON.stringify(c))
    : (c: Chart) => chart.push(c))({
      title: name,
      x: npls,
      series: [
        { name: "ours (cpu)", values: mine.map((m) => m.tg) },
        ...(peer.length
          ? [{
            name: "llama.cpp",
            values: npls.map((n) => peer.find((r) => r.npl === n)?.tg ?? null),
          }]
          : []),
      ],
    });
}
console.log(lines.join("\n"));
if (args.svg) {
  await Deno.writeTextFile(
    args.svg,
    chartSvg(
      chart.map((c) => ({
        title: c.title,
        xLabel: "sequences",
        yLabel: "decode tokens/s",
        x: c.x,
        series: c.series,
      })),
    ),
  );
  console.log(`\nchart: ${args.svg}`);
}
