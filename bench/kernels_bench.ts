/**
 * WebGPU engine benchmark: per-kernel GPU time at decode shapes, step time by batch size next
 * to an empty step's submit + readback, and single-stream decode waiting on every readback vs
 * pipelined vs k steps per submit. Prints markdown tables.
 *
 *   deno run --allow-all bench/kernels_bench.ts                       # stories260K from $MODEL_MIRROR
 *   deno run --allow-all bench/kernels_bench.ts --model path.gguf
 *   deno run --allow-all bench/kernels_bench.ts --synthetic q4_0      # random Llama-3.2-1B shape (any tensor type)
 *   deno run --allow-all bench/kernels_bench.ts --shape qwen25_05b    # a perf file's shape and encodings, random
 *   options: --batches 1,8,32,64  --steps 48  --prompt 16  --layers N (synthetic, shape)
 *            --only kernels (the per-kernel tables alone: quick where a step takes seconds)
 *
 * Uses no npm packages, so it runs on a machine with only a deno binary.
 */
import { acquireGpu, type Gpu } from "../kernels/webgpu/device.ts";
import { WebGpuEngine } from "../kernels/webgpu/webgpu_engine.ts";
import { GREEDY, type StepPlan, type StepResult } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import type { ModelConfig } from "../lib/model/model_config.ts";
import { TENSOR_TYPES, type TensorType } from "../lib/model/tensor.ts";
import { type ModelWeights, stepMatrixBytes } from "../lib/model/weights.ts";
import { chooseRasterizerThreads } from "../kernels/webgpu/adapter.ts";
import { LLAMA_1B_SHAPE, syntheticWeights } from "./synthetic_model.ts";
import { PERF_SHAPES, type PerfShape, perfShapeModel } from "./perf_shapes.ts";
import { markdownTable } from "./markdown_table.ts";

interface Options {
  model?: string;
  synthetic?: TensorType;
  shape?: PerfShape;
  layers?: number;
  batches: number[];
  steps: number;
  prompt: number;
  kernelsOnly: boolean;
}

function parseOptions(args: readonly string[]): Options {
  const opts: Options = { batches: [1, 8, 32, 64], steps: 48, prompt: 16, kernelsOnly: false };
  for (let i = 0; i < args.length; i++) {
    const key = args[i]!;
    const value = args[++i];
    if (value === undefined) throw new Error(`Cannot parse options: ${key} needs a value`);
    switch (key) {
      case "--model":
        opts.model = value;
        break;
      case "--synthetic":
        if (!(TENSOR_TYPES as string[]).includes(value)) {
          throw new Error(
            `--synthetic must be one of ${TENSOR_TYPES.join(", ")}, received ${value}`,
          );
        }
        opts.synthetic = value as TensorType;
        break;
      case "--shape":
        if (!(PERF_SHAPES as string[]).includes(value)) {
          throw new Error(`--shape must be one of ${PERF_SHAPES.join(", ")}, received ${value}`);
        }
        opts.shape = value as PerfShape;
        break;
      case "--layers":
        opts.layers = Number(value);
        break;
      case "--batches":
        opts.batches = value.split(",").map(Number);
        break;
      case "--steps":
        opts.steps = Number(value);
        break;
      case "--prompt":
        opts.prompt = Number(value);
        break;
      case "--only":
        if (value !== "kernels") throw new Error(`--only takes kernels, received ${value}`);
        opts.kernelsOnly = true;
        break;
      default:
        throw new Error(`Cannot parse options: unknown option ${key}`);
    }
  }
  return opts;
}

async function loadSubject(
  o: Options,
): Promise<{ name: string; config: ModelConfig; weights: ModelWeights }> {
  if (o.shape) {
    const { config, weights } = perfShapeModel(o.shape, o.layers);
    return {
      name: `random ${o.shape} (${config.nLayers} layers), the perf file's Q4_K_M encodings`,
      config,
      weights,
    };
  }
  if (o.synthetic) {
    const config = { ...LLAMA_1B_SHAPE, nLayers: o.layers ?? LLAMA_1B_SHAPE.nLayers };
    return {
      name: `random Llama-3.2-1B shape (${config.nLayers} layers), ${o.synthetic}`,
      config,
      weights: syntheticWeights(config, o.synthetic),
    };
  }
  const dir = Deno.env.get("MODEL_MIRROR");
  const path = o.model ?? (dir ? `${dir}/stories260K.bin` : undefined);
  if (!path) {
    throw new Error(
      "Cannot find a model: pass --model or set MODEL_MIRROR to the models directory",
    );
  }
  const m = await loadModel(path);
  return { name: path.split("/").pop()!, config: m.config, weights: m.weights };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const fmt = (x: number, digits = 2) => (Number.isFinite(x) ? x.toFixed(digits) : "-");

/** Sequences 0..batch-1, each with its own blocks, prefilled with `prompt` tokens. */
class Workload {
  readonly tables: number[][];
  constructor(
    readonly engine: WebGpuEngine,
    readonly batch: number,
    readonly prompt: number,
    readonly blocksEach: number,
    readonly seqBase = 0,
  ) {
    this.tables = Array.from(
      { length: batch },
      (_, i) => Array.from({ length: blocksEach }, (_, j) => i * blocksEach + j),
    );
  }

  /** Prefills every sequence, as many per step as fit in `maxRows` token rows. */
  async prefill(maxRows = 512): Promise<void> {
    const vocab = this.engine.config.vocabSize;
    const perStep = Math.max(1, Math.floor(maxRows / this.prompt));
    const steps: Promise<StepResult>[] = [];
    for (let first = 0; first < this.batch; first += perStep) {
      steps.push(this.engine.step({
        stepId: 0,
        seqs: this.tables.slice(first, first + perStep).map((blockTable, j) => ({
          seqId: this.seqBase + first + j,
          tokens: Array.from(
            { length: this.prompt },
            (_, p) => (1 + (first + j) * 31 + p * 7) % vocab,
          ),
          startPos: 0,
          blockTable,
          sample: true,
          sampling: GREEDY,
        })),
      }));
    }
    await Promise.all(steps);
  }

  /** The k-th decode step after the prompt: every sequence feeds back its last sampled token. */
  decode(k: number): StepPlan {
    return {
      stepId: k + 1,
      seqs: this.tables.map((blockTable, i) => ({
        seqId: this.seqBase + i,
        tokens: [],
        useLastSampled: true,
        startPos: this.prompt + k,
        blockTable,
        sample: true,
        sampling: GREEDY,
      })),
    };
  }
}

async function timeIt(f: () => Promise<unknown>): Promise<number> {
  const t = performance.now();
  await f();
  return performance.now() - t;
}

/** The headline numbers of a run, for bench/mod.ts or a notes file. */
export interface KernelsBenchResult {
  readonly device: string;
  readonly model: string;
  /** Compute dispatches of one decode step at batch 1, as the engine encoded them. */
  readonly dispatchesPerStep: number;
  readonly emptyStep: { readonly waitedMs: number; readonly pipelinedMs: number };
  readonly steps: readonly {
    readonly batch: number;
    readonly waitedMs: number;
    readonly pipelinedMs: number;
  }[];
  readonly singleStream: readonly { readonly mode: string; readonly msPerToken: number }[];
}

/**
 * Runs the benchmark with command-line style options, writing markdown through `print`.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const argv = ["--model", "stories260K.bin", "--batches", "1,4", "--steps", "4"];
 * const r = await runKernelsBench(argv, () => {}); // the tables not printed
 * assertEquals(r.steps.map((s) => s.batch), [1, 4]);
 * ```
 */
export async function runKernelsBench(
  argv: readonly string[],
  print: (text: string) => void = console.log,
): Promise<KernelsBenchResult> {
  const o = parseOptions(argv);
  const subject = await loadSubject(o);
  // As the engine would for itself: the rasterizer's threads are settled by the first adapter.
  chooseRasterizerThreads(stepMatrixBytes(subject.weights));
  const gpu: Gpu = await acquireGpu();
  const { config } = subject;
  const maxBatch = Math.max(...o.batches);
  const positions = o.prompt + 4 * o.steps + 8;
  const blocksEach = Math.ceil(positions / 16);
  const t0 = performance.now();
  const engine = await WebGpuEngine.create(config, subject.weights, {
    numBlocks: maxBatch * blocksEach + 1,
    blockSize: 16,
  }, {
    gpu,
    maxSeqs: Math.max(64, maxBatch),
    maxBatchTokens: Math.max(512, maxBatch),
  });
  const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
  print(`# WebGPU engine benchmark\n`);
  print(
    `- device: ${gpu.description}${gpu.inlineDispatch ? ", dispatches inline" : ""}${
      gpu.laneSubgroups ? ", 8-lane subgroups" : ""
    } (binding limit ${mib(gpu.maxBindingBytes)})`,
  );
  print(
    `- model: ${subject.name}: dim ${config.dim}, ${config.nLayers} layers, ${config.nHeads}/${config.nKvHeads} heads, vocab ${config.vocabSize}`,
  );
  print(
    `- device memory: weights ${mib(engine.memory.weights)}, KV ${
      mib(engine.memory.kvCache)
    }, activations ${mib(engine.memory.activations)}; set-up ${fmt(performance.now() - t0, 0)} ms`,
  );
  print(`- decode at position ${o.prompt}+, ${o.steps} steps per measurement\n`);

  // Per-kernel GPU time (timestamp queries, each kernel in its own pass; min of 5).
  for (const batch of new Set([1, maxBatch])) {
    const w = new Workload(engine, batch, o.prompt, blocksEach);
    await w.prefill();
    const plan = w.decode(0);
    const runs: Awaited<ReturnType<WebGpuEngine["profileStep"]>>[] = [];
    for (let r = 0; r < 5; r++) runs.push(await engine.profileStep(plan));
    const families = new Map<string, { calls: number; ms: number; flops: number; bytes: number }>();
    runs[0]!.forEach((k, i) => {
      const f = families.get(k.label) ?? { calls: 0, ms: 0, flops: 0, bytes: 0 };
      f.calls++;
      f.ms += Math.min(...runs.map((r) => r[i]!.ms));
      f.flops += k.flops;
      f.bytes += k.bytes;
      families.set(k.label, f);
    });
    const total = [...families.values()].reduce((s, f) => s + f.ms, 0);
    print(`## Kernels, one decode step at batch ${batch} (GPU time, min of 5)\n`);
    print(markdownTable(
      ["kernel", "dispatches", "ms", "share", "GFLOP/s", "GB/s"],
      [...families].map(([label, f]) => [
        label,
        String(f.calls),
        fmt(f.ms, 3),
        `${fmt((100 * f.ms) / total, 0)}%`,
        fmt(f.flops / f.ms / 1e6, 2),
        fmt(f.bytes / f.ms / 1e6, 2),
      ]).concat([["**total**", String(runs[0]!.length), fmt(total, 3), "100%", "", ""]]),
    ));
  }

  // Dispatches of a decode step at batch 1, counted as the engine encoded them.
  const counted = new Workload(engine, 1, o.prompt, blocksEach, 2000);
  await counted.prefill();
  await engine.step(counted.decode(0));
  const dispatches = engine.lastStepDispatches;
  print(
    `- dispatches per decode step (batch 1): ${dispatches} for ${config.nLayers} layers (the embedding, the final norm unless the last down projection writes it, the classifier and the sampler once each, or once per chunk of a matrix split across bindings)\n`,
  );
  if (o.kernelsOnly) {
    engine.dispose();
    gpu.device.destroy();
    const none = { waitedMs: NaN, pipelinedMs: NaN };
    return {
      device: gpu.description,
      model: subject.name,
      emptyStep: none,
      dispatchesPerStep: dispatches,
      steps: [],
      singleStream: [],
    };
  }

  // Step time by batch size, next to an empty step (submit + readback, no kernels).
  const empty = (id: number): StepPlan => ({ stepId: id, seqs: [] });
  for (let i = 0; i < 3; i++) await engine.step(empty(i));
  const emptyTimes: number[] = [];
  for (let i = 0; i < 8; i++) emptyTimes.push(await timeIt(() => engine.step(empty(i))));
  const emptyWaited = median(emptyTimes);
  const emptyPiped =
    (await timeIt(() => Promise.all(Array.from({ length: 32 }, (_, i) => engine.step(empty(i)))))) /
    32;
  const rows: string[][] = [["empty step", "-", fmt(emptyWaited), fmt(emptyPiped), "-", "-"]];
  let batch1 = NaN;
  const steps: { batch: number; waitedMs: number; pipelinedMs: number }[] = [];
  for (const batch of o.batches) {
    const w = new Workload(engine, batch, o.prompt, blocksEach);
    await w.prefill();
    await engine.step(w.decode(0));
    const waited: number[] = [];
    for (let k = 1; k <= Math.min(8, o.steps); k++) {
      waited.push(await timeIt(() => engine.step(w.decode(k))));
    }
    const n = o.steps;
    const piped = (await timeIt(() =>
      Promise.all(Array.from({ length: n }, (_, k) =>
        engine.step(w.decode(k))))
    )) / n;
    if (batch === o.batches[0]) batch1 = piped;
    steps.push({ batch, waitedMs: median(waited), pipelinedMs: piped });
    rows.push([
      `batch ${batch}`,
      String(batch),
      fmt(median(waited)),
      fmt(piped),
      fmt((batch * 1000) / piped, 0),
      fmt(piped / batch1),
    ]);
  }
  print(`## Step time by batch size (decode, ms per step)\n`);
  print(
    "waited = submit, then await the readback; pipelined = steps submitted back to back, time per step.\n",
  );
  print(
    markdownTable([
      "step",
      "sequences",
      "waited ms",
      "pipelined ms",
      "tokens/s (pipelined)",
      `pipelined × batch ${o.batches[0]}`,
    ], rows),
  );

  // Single-stream decode.
  const single = new Workload(engine, 1, o.prompt, blocksEach, 1000);
  await single.prefill();
  const n = o.steps;
  const modes: [string, () => Promise<unknown>][] = [
    ["wait for every readback", async () => {
      for (let k = 0; k < n; k++) await engine.step(single.decode(k));
    }],
    ...[2, 4].map((
      window,
    ): [string, () => Promise<unknown>] => [`pipelined, ${window} steps in flight`, async () => {
      const inFlight: Promise<StepResult>[] = [];
      for (let k = 0; k < n; k++) {
        inFlight.push(engine.step(single.decode(k)));
        if (inFlight.length >= window) await inFlight.shift();
      }
      await Promise.all(inFlight);
    }]),
    [
      `pipelined, all ${n} in flight`,
      () => Promise.all(Array.from({ length: n }, (_, k) => engine.step(single.decode(k)))),
    ],
    ...[4, 8].map((
      k,
    ): [string, () => Promise<unknown>] => [`${k} steps per submit, waited`, async () => {
      for (let s = 0; s < n; s += k) {
        await Promise.all(
          engine.stepMany(
            Array.from({ length: Math.min(k, n - s) }, (_, j) => single.decode(s + j)),
          ),
        );
      }
    }]),
  ];
  const results: [string, number][] = [];
  for (const [name, run] of modes) {
    await run(); // warm-up
    results.push([name, (await timeIt(run)) / n]);
  }
  const base = results[0]![1];
  print(`## Single-stream decode (batch 1, ${n} tokens)\n`);
  print(markdownTable(
    ["mode", "ms/token", "tokens/s", "× waiting"],
    results.map(([name, ms]) => [name, fmt(ms), fmt(1000 / ms, 0), fmt(base / ms)]),
  ));
  engine.dispose();
  gpu.device.destroy();
  return {
    device: gpu.description,
    model: subject.name,
    dispatchesPerStep: dispatches,
    emptyStep: { waitedMs: emptyWaited, pipelinedMs: emptyPiped },
    steps,
    singleStream: results.map(([mode, msPerToken]) => ({ mode, msPerToken })),
  };
}

if (import.meta.main) await runKernelsBench(Deno.args);
