/**
 * Throughput scaling of the serving core on a real model: aggregate output tokens/s with N
 * concurrent greedy generations of a fixed length, against one generation alone, measured in
 * the same run on each backend. The requests go through the whole core (request actors,
 * scheduler, executor, engine) in-process, without HTTP.
 *
 *   MODEL_MIRROR=../shared/models deno run -A bench/throughput_bench.ts [--tokens 128] [--concurrency 1,8,32,64] [--backends webgpu,cpu] [--in-flight N (default: the server's depth for the backend)]
 */
import { DEFAULT_LIMITS } from "../lib/engine/limits.ts";
import { parseArgs } from "@std/cli/parse-args";
import type { BackendChoice } from "../lib/compose/engine_factory.ts";
import { openServing } from "../lib/compose/open_serving.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import type { GenerationEvent } from "../lib/core/generation.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { resolveModelSource } from "../lib/source/model_source.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import type { Model } from "../lib/model/weights.ts";
import { markdownTable } from "./markdown_table.ts";

const PROMPTS = [
  "Once upon a time",
  "Tom had a dog",
  "The sun was hot",
  "Lily saw a bird",
  "One day, a cat",
];

export interface ThroughputRow {
  backend: string;
  concurrency: number;
  tokens: number;
  seconds: number;
  tokensPerSecond: number;
  speedup: number;
}

async function runOnce(
  model: Model,
  tokenizer: Tokenizer,
  backend: BackendChoice,
  n: number,
  tokens: number,
  maxInFlight: number | undefined,
) {
  const blockSize = DEFAULT_LIMITS.blockSize;
  const numBlocks = Math.ceil((n * (tokens + 32)) / blockSize) + 8;
  const limits = { maxBatchTokens: DEFAULT_LIMITS.maxBatchTokens, maxSeqs: Math.max(n, 1) };
  const { core } = await openServing({
    model,
    tokenizer,
    backend,
    kv: { numBlocks, blockSize },
    limits,
    ...(maxInFlight === undefined ? {} : { maxInFlight }),
  });
  const one = async (i: number) => {
    let produced = 0;
    const events: AsyncIterable<GenerationEvent> = core.generate({
      prompt: tokenizer.encode(PROMPTS[i % PROMPTS.length]!),
      maxTokens: tokens,
      sampling: GREEDY,
      stop: [],
      priority: "interactive",
      requestId: `bench-${i}`,
    });
    for await (const e of events) {
      if (e.type === "done") produced = e.usage.completionTokens;
      if (e.type === "error") throw new Error(`generation ${i} failed: ${e.message}`);
    }
    return produced;
  };
  await one(0); // warm-up: pipelines compiled, JIT warm
  const started = performance.now();
  const counts = await Promise.all(Array.from({ length: n }, (_, i) => one(i)));
  const seconds = (performance.now() - started) / 1000;
  await core.close();
  return { tokens: counts.reduce((a, b) => a + b, 0), seconds };
}

/** Runs every (backend, concurrency) pair; speedup is against concurrency 1 on the same backend. */
export async function runThroughputBench(opts: {
  tokens: number;
  concurrency: number[];
  backends: BackendChoice[];
  /** Steps planned ahead of their results (default: the server's, defaultPipelineDepth). */
  maxInFlight?: number;
}): Promise<ThroughputRow[]> {
  const source = await resolveModelSource("stories260K");
  const model = await loadModel(source.modelPath, { tokenizerPath: source.tokenizerPath });
  const tokenizer = new Tokenizer(model.tokenizer!);
  const rows: ThroughputRow[] = [];
  for (const backend of opts.backends) {
    let base = 0;
    for (const n of opts.concurrency) {
      const { tokens, seconds } = await runOnce(
        model,
        tokenizer,
        backend,
        n,
        opts.tokens,
        opts.maxInFlight,
      );
      const tps = tokens / seconds;
      if (n === opts.concurrency[0]) base = tps;
      rows.push({
        backend,
        concurrency: n,
        tokens,
        seconds,
        tokensPerSecond: tps,
        speedup: tps / base,
      });
    }
  }
  return rows;
}

export function throughputTable(rows: ThroughputRow[]): string {
  return markdownTable(
    ["backend", "concurrent", "tokens", "seconds", "tokens/s", "× one alone"],
    rows.map((r) => [
      r.backend,
      String(r.concurrency),
      String(r.tokens),
      r.seconds.toFixed(2),
      r.tokensPerSecond.toFixed(0),
      r.speedup.toFixed(1),
    ]),
  );
}

if (import.meta.main) {
  const args = parseArgs(Deno.args, { string: ["tokens", "concurrency", "backends", "in-flight"] });
  const rows = await runThroughputBench({
    tokens: Number(args.tokens ?? 128),
    concurrency: (args.concurrency ?? "1,8,32,64").split(",").map(Number),
    backends: (args.backends ?? "webgpu,cpu").split(",") as BackendChoice[],
    ...(args["in-flight"] === undefined ? {} : { maxInFlight: Number(args["in-flight"]) }),
  });
  console.log(
    `## Throughput scaling, stories260K, ${args.tokens ?? 128} tokens per generation, greedy\n`,
  );
  console.log(throughputTable(rows));
}
