/**
 * Matmul throughput per tensor type: the same [rows, cols] weight matrix in every encoding the
 * kernels read, multiplied by `--batch` activation rows, timed in one run on one device. Decode
 * matmuls are bound by reading the weights, so the figure is weight GB/s, as a share of what
 * the plain F16 kernel reaches in the same run (and time per matmul against F16's).
 *
 *   deno run --allow-all bench/matmul_formats_bench.ts
 *   options: --rows 2048 --cols 2048 --batch 1 --layout lane|split (default: the device's)
 *            --repeat 20 (matmuls per timed submit)
 *            --bandwidth-gbs N (the device's memory bandwidth, for the share column; default:
 *            the datasheet figure of a GPU named in DATASHEET_BANDWIDTH, else no share column)
 *            --classifier N (the final norm + classifier for N sampled rows of --batch: the
 *            classifier kernel against the fused-norm gathered matmul it replaced, same run;
 *            e.g. --rows 128256 --cols 2048 for Llama 3's vocabulary)
 *
 * Timing: `repeat` dispatches in one compute pass, submitted, awaited with
 * onSubmittedWorkDone(); the best of 5 such runs (taken round-robin over the types), divided
 * by `repeat`. Uses no npm packages.
 */
import { acquireGpu } from "../kernels/webgpu/device.ts";
import { destroyMatrix, uploadMatrix } from "../kernels/webgpu/gpu_matrix.ts";
import { createClassifier } from "../kernels/webgpu/classifier.ts";
import type { KernelOp } from "../kernels/webgpu/device.ts";
import { createMatmul, type MatmulLayout } from "../kernels/webgpu/matmul.ts";
import { DIM_ROWS, DIM_SAMPLES, SAMPLE_WORDS } from "../kernels/webgpu/step_meta.ts";
import { uploadBuffer } from "../kernels/webgpu/device.ts";
import { BLOCK_LAYOUT, byteSize, TENSOR_TYPES, type TensorType } from "../lib/model/tensor.ts";
import { markdownTable } from "./markdown_table.ts";
import { randomData } from "./synthetic_model.ts";

export interface FormatsOptions {
  readonly rows: number;
  readonly cols: number;
  readonly batch: number;
  readonly repeat: number;
  readonly layout?: MatmulLayout;
  readonly bandwidthGbs?: number;
  readonly classifier?: number;
}

/**
 * Datasheet memory bandwidth (GB/s) of GPUs the benchmark may meet, matched against the
 * adapter's description; first match wins, so longer names come first.
 */
export const DATASHEET_BANDWIDTH: readonly (readonly [RegExp, number])[] = [
  [/H200/i, 4800],
  [/H100.*PCIe/i, 2000],
  [/H100/i, 3350],
  [/A100.*40GB/i, 1555],
  [/A100/i, 2039],
  [/L40S?/i, 864],
  [/RTX 4090/i, 1008],
  [/A10\b/i, 600],
  [/T4\b/i, 320],
];

/** The datasheet bandwidth for an adapter description, or undefined when it names none known. */
export function datasheetBandwidth(description: string): number | undefined {
  return DATASHEET_BANDWIDTH.find(([name]) => name.test(description))?.[1];
}

export interface FormatResult {
  readonly type: TensorType;
  readonly bitsPerWeight: number;
  readonly weightBytes: number;
  readonly usPerMatmul: number;
  readonly gbPerS: number;
  /** With --classifier: the replaced fused-norm gathered matmul, timed in the same run. */
  readonly before?: { readonly usPerMatmul: number; readonly gbPerS: number };
}

function parseOptions(args: readonly string[]): FormatsOptions {
  const o: { -readonly [K in keyof FormatsOptions]: FormatsOptions[K] } = {
    rows: 2048,
    cols: 2048,
    batch: 1,
    repeat: 20,
  };
  for (let i = 0; i < args.length; i += 2) {
    const [key, value] = [args[i]!, args[i + 1]];
    if (value === undefined) throw new Error(`Cannot parse options: ${key} needs a value`);
    if (key === "--layout") {
      if (value !== "lane" && value !== "split") {
        throw new Error(`--layout must be lane or split, received ${value}`);
      }
      o.layout = value;
      continue;
    }
    const n = Number(value);
    if (!Number.isInteger(n) || n < 1) {
      throw new Error(`Cannot parse options: ${key} needs a positive integer, received ${value}`);
    }
    if (key === "--bandwidth-gbs") o.bandwidthGbs = n;
    else if (key === "--rows") o.rows = n;
    else if (key === "--cols") o.cols = n;
    else if (key === "--batch") o.batch = n;
    else if (key === "--repeat") o.repeat = n;
    else if (key === "--classifier") o.classifier = n;
    else throw new Error(`Cannot parse options: unknown option ${key}`);
  }
  if (o.classifier !== undefined && o.classifier > o.batch) {
    throw new Error(
      `--classifier samples rows of --batch: needs at most ${o.batch}, received ${o.classifier}`,
    );
  }
  if (o.cols % 256 !== 0) {
    throw new Error(`--cols must be a multiple of 256 (K-quant blocks), received ${o.cols}`);
  }
  return o;
}

/**
 * Times every tensor type's matmul and prints a markdown table through `print`.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { TENSOR_TYPES } from "../lib/model/tensor.ts";
 *
 * const argv = ["--rows", "256", "--cols", "256", "--repeat", "2"];
 * const results = await runFormatsBench(argv, () => {}); // the table not printed
 * assertEquals(results.map((r) => r.type), TENSOR_TYPES); // one row per tensor type
 * ```
 */
export async function runFormatsBench(
  argv: readonly string[],
  print: (text: string) => void = console.log,
): Promise<FormatResult[]> {
  const o = parseOptions(argv);
  const gpu = await acquireGpu();
  const layout = o.layout ?? (gpu.cpuRasterizer ? "lane" : "split");
  const dims = new Uint32Array(4);
  dims[DIM_ROWS] = o.batch;
  const dimsBuffer = uploadBuffer(gpu, dims, GPUBufferUsage.UNIFORM, "dims");
  const xs = new Float32Array(o.batch * o.cols).map((_, i) => Math.sin(i) * 0.5);
  const x = uploadBuffer(gpu, xs, GPUBufferUsage.STORAGE, "x");
  const y = gpu.device.createBuffer({
    size: o.batch * o.rows * 4,
    usage: GPUBufferUsage.STORAGE,
    label: "y",
  });
  // Classifier mode: sampled row i reads x row batch - 1 - i (a gather, as in the engine).
  const sampled = o.classifier ?? 0;
  const sampleWords = new Uint32Array(Math.max(1, sampled) * SAMPLE_WORDS);
  for (let i = 0; i < sampled; i++) sampleWords[i * SAMPLE_WORDS] = o.batch - 1 - i;
  const samples = uploadBuffer(gpu, sampleWords, GPUBufferUsage.STORAGE, "samples");
  const sampleDims = uploadBuffer(
    gpu,
    new Uint32Array(4).fill(sampled, DIM_SAMPLES, DIM_SAMPLES + 1),
    GPUBufferUsage.UNIFORM,
    "sample dims",
  );
  const norm = {
    weight: uploadBuffer(gpu, new Float32Array(o.cols).fill(1.5), GPUBufferUsage.STORAGE, "norm"),
    eps: 1e-5,
  };
  const subjects = TENSOR_TYPES.map((type) => {
    const shape = [o.rows, o.cols];
    const bytes = byteSize(type, shape);
    const m = uploadMatrix(gpu, { name: type, type, shape, data: randomData(type, bytes, 7) });
    if (o.classifier === undefined) {
      const op = createMatmul(gpu, m, { dims: dimsBuffer, x, y, rowsField: DIM_ROWS, layout });
      return { type, bytes, m, op, best: Infinity };
    }
    const target = { dims: sampleDims, x, y, samples, norm };
    const op = createClassifier(gpu, m, { ...target, maxRows: sampled, layout });
    const before = createMatmul(gpu, m, { ...target, rowsField: DIM_SAMPLES, layout });
    return { type, bytes, m, op, before, best: Infinity, bestBefore: Infinity };
  });
  const run = async (op: KernelOp, n: number) => {
    const enc = gpu.device.createCommandEncoder();
    const pass = enc.beginComputePass();
    for (let i = 0; i < n; i++) op.encode(pass, o.classifier ?? o.batch);
    pass.end();
    const t = performance.now();
    gpu.device.queue.submit([enc.finish()]);
    await gpu.device.queue.onSubmittedWorkDone();
    return performance.now() - t;
  };
  for (const s of subjects) {
    await run(s.op, 2); // compile and warm up
    if (s.before) await run(s.before, 2);
  }
  // Round-robin over the types (and kernels), so a change in machine load hits all alike.
  for (let r = 0; r < 5; r++) {
    for (const s of subjects) {
      s.best = Math.min(s.best, await run(s.op, o.repeat));
      if (s.before) s.bestBefore = Math.min(s.bestBefore!, await run(s.before, o.repeat));
    }
  }
  const results: FormatResult[] = subjects.map((s) => {
    const ms = s.best / o.repeat;
    const { elements, bytes: blockBytes } = BLOCK_LAYOUT[s.type];
    destroyMatrix(s.m);
    return {
      type: s.type,
      bitsPerWeight: (8 * blockBytes) / elements,
      weightBytes: s.bytes,
      usPerMatmul: ms * 1000,
      gbPerS: s.bytes / ms / 1e6,
      ...(s.before
        ? {
          before: {
            usPerMatmul: (s.bestBefore! / o.repeat) * 1000,
            gbPerS: s.bytes / (s.bestBefore! / o.repeat) / 1e6,
          },
        }
        : {}),
    };
  });
  const f16 = results.find((r) => r.type === "f16")!;
  const fmt = (v: number, d = 2) => v.toFixed(d);
  const bandwidth = o.bandwidthGbs ?? datasheetBandwidth(gpu.description);
  print(`# Matmul throughput by tensor type\n`);
  print(`- device: ${gpu.description}; layout ${layout}`);
  print(
    bandwidth === undefined
      ? "- memory bandwidth: unknown for this adapter (pass --bandwidth-gbs for a share column)"
      : `- memory bandwidth assumed: ${bandwidth} GB/s (${
        o.bandwidthGbs === undefined ? "datasheet figure for this adapter" : "--bandwidth-gbs"
      })`,
  );
  print(
    `- W [${o.rows}, ${o.cols}] × ${o.batch} activation row(s); best of 5 submits of ${o.repeat} matmuls\n`,
  );
  if (o.classifier !== undefined) {
    print(
      `Classifier: final RMSNorm + W · x for ${o.classifier} sampled row(s) gathered from the ${o.batch}; before = the fused-norm gathered matmul (createMatmul), after = createClassifier, same run.\n`,
    );
    print(markdownTable(
      [
        "type",
        "bits/weight",
        "weights MiB",
        "µs before",
        "µs after",
        "GB/s before",
        "GB/s after",
        "speed-up",
      ],
      results.map((r) => [
        r.type,
        fmt(r.bitsPerWeight, 4).replace(/\.?0+$/, ""),
        fmt(r.weightBytes / 2 ** 20),
        fmt(r.before!.usPerMatmul, 1),
        fmt(r.usPerMatmul, 1),
        fmt(r.before!.gbPerS),
        fmt(r.gbPerS),
        `${fmt(r.before!.usPerMatmul / r.usPerMatmul)}x`,
      ]),
    ));
    gpu.device.destroy();
    return results;
  }
  print(markdownTable(
    [
      "type",
      "bits/weight",
      "weights MiB",
      "µs / matmul",
      "weight GB/s",
      "GB/s ÷ F16",
      "time ÷ F16",
      ...(bandwidth === undefined ? [] : ["share of bandwidth"]),
    ],
    results.map((r) => [
      r.type,
      fmt(r.bitsPerWeight, 4).replace(/\.?0+$/, ""),
      fmt(r.weightBytes / 2 ** 20),
      fmt(r.usPerMatmul, 1),
      fmt(r.gbPerS),
      fmt(r.gbPerS / f16.gbPerS),
      fmt(r.usPerMatmul / f16.usPerMatmul),
      ...(bandwidth === undefined ? [] : [`${fmt((100 * r.gbPerS) / bandwidth, 1)}%`]),
    ]),
  ));
  gpu.device.destroy();
  return results;
}

if (import.meta.main) await runFormatsBench(Deno.args);
