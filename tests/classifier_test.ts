import { assert, assertEquals, assertLess, assertThrows } from "@std/assert";
import { laneSubgroupsFit, requestDefaultAdapter } from "../kernels/webgpu/adapter.ts";
import { classifierTile, createClassifier } from "../kernels/webgpu/classifier.ts";
import type { Gpu } from "../kernels/webgpu/device.ts";
import { uploadMatrix } from "../kernels/webgpu/gpu_matrix.ts";
import type { SampleMeta } from "../kernels/webgpu/step_meta.ts";
import { dequantize } from "../lib/model/dequantize.ts";
import { matvec, rmsnorm } from "../kernels/reference/ops.ts";
import type { Tensor, TensorType } from "../lib/model/tensor.ts";
import {
  randomF32,
  randomTensor,
  readF32,
  relativeError,
  rng,
  runPass,
  stepMeta,
  storage,
  testGpu,
} from "./_gpu.ts";

/** The encodings classifiers come in (llama-quantize's Q6_K and Q8_0, K-quant and float files). */
const TYPES: TensorType[] = ["q8_0", "q6_k", "q4_k", "f16", "bf16", "f32"];
/** More outputs than one grid dimension (65,535) or one llvmpipe loop may cover. */
const TALL = 70_000;
const COLS = 256;
const LAYOUTS = ["lane", "split"] as const;

function sample(row: number): SampleMeta {
  return { row, lastSlot: 0, seed: 0, position: 0, temperature: 0, topK: 0, topP: 1, minP: 0 };
}

/** Runs the classifier on rows `gather` of x; returns the logits, [gather.length, w rows]. */
async function classify(
  gpu: Gpu,
  w: Tensor,
  x: Float32Array,
  normW: Float32Array,
  gather: number[],
  layout: "lane" | "split",
): Promise<Float32Array> {
  const [rows, cols] = w.shape as [number, number];
  const meta = stepMeta(gpu, {
    rows: Array.from({ length: x.length / cols }, () => ({ token: 0, pos: 0, seq: 0, slot: 0 })),
    seqs: [],
    samples: gather.map(sample),
    blockTables: [],
  });
  const y = storage(gpu, new Float32Array(gather.length * rows).fill(NaN));
  const m = uploadMatrix(gpu, w);
  const op = createClassifier(gpu, m, {
    dims: meta.dims,
    samples: meta.samples,
    x: storage(gpu, x),
    y,
    norm: { weight: storage(gpu, normW), eps: 1e-5 },
    maxRows: gather.length,
    layout,
  });
  await runPass(gpu, (pass) => op.encode(pass, gather.length));
  const got = await readF32(gpu, y, gather.length * rows);
  op.destroy();
  return got;
}

/** The CPU reference: dequantize, rmsnorm, matvec, row by row. */
function reference(w: Tensor, x: Float32Array, normW: Float32Array, gather: number[]) {
  const [rows, cols] = w.shape as [number, number];
  const dense = dequantize(w);
  const want = new Float32Array(gather.length * rows);
  gather.forEach((src, i) => {
    const xr = rmsnorm(new Float32Array(cols), x.slice(src * cols, (src + 1) * cols), normW, 1e-5);
    want.set(matvec(new Float32Array(rows), dense, xr), i * rows);
  });
  return want;
}

for (const type of TYPES) {
  Deno.test(`createClassifier() ${type} at ${TALL} outputs matches dequantize + rmsnorm + matvec for 1 and 3 sampled rows`, async () => {
    const gpu = await testGpu();
    const rand = rng(17);
    const w = randomTensor(rand, type, TALL, COLS, "output");
    const x = randomF32(rand, 5 * COLS, 2);
    const normW = randomF32(rand, COLS);
    for (const gather of [[3], [4, 0, 2]]) {
      const want = reference(w, x, normW, gather);
      for (const layout of LAYOUTS) {
        const got = await classify(gpu, w, x, normW, gather, layout);
        const err = relativeError(got, want);
        assertLess(err, 1e-5, `${type} ${layout} rows [${gather}]: relative error ${err}`);
      }
    }
  });
}

Deno.test("createClassifier() reads rows of several blocks (768 wide: Q6_K blocks 2 bytes off a word in every row)", async () => {
  const gpu = await testGpu();
  const rand = rng(29);
  const x = randomF32(rand, 3 * 768, 2);
  const normW = randomF32(rand, 768);
  for (const type of TYPES) {
    const w = randomTensor(rand, type, 99, 768, "output");
    const want = reference(w, x, normW, [2, 1]);
    for (const layout of LAYOUTS) {
      const err = relativeError(await classify(gpu, w, x, normW, [2, 1], layout), want);
      assertLess(err, 1e-5, `${type} ${layout}: relative error ${err}`);
    }
  }
});

Deno.test("createClassifier() covers outputs over the y and z grid dimensions where one is too short", async () => {
  const real = await testGpu();
  // 7 workgroups per dimension: 1,000 outputs need the z dimension on either layout.
  const gpu: Gpu = { ...real, maxWorkgroupsPerDimension: 7 };
  const rand = rng(3);
  const w = randomTensor(rand, "q6_k", 1000, COLS, "output");
  const x = randomF32(rand, 2 * COLS, 2);
  const normW = randomF32(rand, COLS);
  const want = reference(w, x, normW, [1, 0]);
  for (const layout of LAYOUTS) {
    const err = relativeError(await classify(gpu, w, x, normW, [1, 0], layout), want);
    assertLess(err, 1e-5, `${layout}: relative error ${err}`);
  }
});

Deno.test("createClassifier() gives each sampled row the same bits whatever rows sample beside it", async () => {
  const gpu = await testGpu();
  const rand = rng(41);
  const n = 11; // row tiles 1, 2, 4 and 8, and 8 + 4 in two passes
  const x = randomF32(rand, n * COLS, 2);
  const normW = randomF32(rand, COLS);
  for (const type of ["q6_k", "q8_0", "f16"] as const) {
    const w = randomTensor(rand, type, 300, COLS, "output");
    for (const layout of LAYOUTS) {
      const all = Array.from({ length: n }, (_, i) => (i * 7) % n);
      const batch = await classify(gpu, w, x, normW, all, layout);
      for (const k of [1, 2, 3, 5, 9]) {
        const some = all.slice(0, k);
        const got = await classify(gpu, w, x, normW, some, layout);
        assert(
          got.every((v, i) => v === batch[i]),
          `${type} ${layout}: the first ${k} rows alone differ from the same rows among ${n}`,
        );
      }
    }
  }
});

Deno.test("classifierTile() takes the smallest tile covering the rows, passes of 8 beyond", () => {
  assertEquals([1, 2, 3, 4, 5, 8, 9, 17].map(classifierTile), [
    { tile: 1, passes: 1 },
    { tile: 2, passes: 1 },
    { tile: 4, passes: 1 },
    { tile: 4, passes: 1 },
    { tile: 8, passes: 1 },
    { tile: 8, passes: 1 },
    { tile: 8, passes: 2 },
    { tile: 8, passes: 3 },
  ]);
});

Deno.test("createClassifier() multiplies rows normalized elsewhere as they are, and takes the final norm or those rows, exactly one", async () => {
  const gpu = await testGpu();
  const rand = rng(21);
  const w = randomTensor(rand, "f32", 40, 64, "w");
  // Two compact rows already normalized (the last down projection's epilogue writes them).
  const xn = randomF32(rand, 2 * 64);
  const meta = stepMeta(gpu, {
    rows: [0, 1, 2].map(() => ({ token: 0, pos: 0, seq: 0, slot: 0 })),
    seqs: [],
    samples: [2, 0].map(sample),
    blockTables: [],
  });
  const y = storage(gpu, new Float32Array(2 * 40).fill(NaN));
  const common = { dims: meta.dims, samples: meta.samples, x: storage(gpu, xn), y, maxRows: 2 };
  const m = uploadMatrix(gpu, w);
  const op = createClassifier(gpu, m, { ...common, normalized: storage(gpu, xn) });
  await runPass(gpu, (pass) => op.encode(pass, 2));
  const dense = dequantize(w);
  const want = new Float32Array(2 * 40);
  for (const i of [0, 1]) {
    want.set(matvec(new Float32Array(40), dense, xn.slice(i * 64, (i + 1) * 64)), i * 40);
  }
  assertLess(relativeError(await readF32(gpu, y, 2 * 40), want), 1e-5);
  const norm = { weight: storage(gpu, randomF32(rand, 64)), eps: 1e-5 };
  for (const both of [{}, { norm, normalized: storage(gpu, xn) }]) {
    assertThrows(
      () => createClassifier(gpu, m, { ...common, ...both }),
      Error,
      "give the final norm or the normalized rows, exactly one",
    );
  }
});

Deno.test("createClassifier() lanes share activations by subgroupBroadcast on a CPU rasterizer, with the same bits as every lane loading them", async () => {
  const gpu = await testGpu();
  // Granted where the adapter says its subgroups are always the lane kernels' 8 lanes (lavapipe
  // on Vulkan); OpenGL ES offers none, and there both paths load (the reference still checks).
  const adapter = await requestDefaultAdapter();
  assertEquals(
    gpu.laneSubgroups,
    adapter !== null && laneSubgroupsFit(adapter.info),
    "subgroups granted for the lane kernels",
  );
  const loads: Gpu = { ...gpu, laneSubgroups: false };
  const rand = rng(41);
  const x = randomF32(rand, 4 * 768, 2);
  const normW = randomF32(rand, 768);
  for (const type of ["q8_0", "q6_k", "q4_k"] as const) {
    const w = randomTensor(rand, type, 130, 768, "output");
    for (const gather of [[1], [3, 0, 2]]) {
      const shared = await classify(gpu, w, x, normW, gather, "lane");
      assertEquals(
        shared,
        await classify(loads, w, x, normW, gather, "lane"),
        `${type} [${gather}]`,
      );
      const err = relativeError(shared, reference(w, x, normW, gather));
      assertLess(err, 1e-5, `${type} [${gather}] against the CPU reference: ${err}`);
    }
  }
});
