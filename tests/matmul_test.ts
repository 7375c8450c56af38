import { assert, assertLess } from "@std/assert";
import { acquireGpu, type Gpu } from "../kernels/device.ts";
import { uploadMatrix } from "../kernels/gpu_matrix.ts";
import { createMatmul, type MatmulEpilogue } from "../kernels/matmul.ts";
import { dequantize } from "../lib/dequantize.ts";
import { matvec } from "../lib/reference/ops.ts";
import type { TensorType } from "../lib/tensor.ts";
import { randomF32, randomTensor, readF32, relativeError, rng, runPass, storage, testGpu } from "./_gpu.ts";

const TYPES: TensorType[] = ["f32", "f16", "q8_0", "q4_0"];

/** Runs W·x on the GPU for `rows` activation rows and returns [gpu, cpu twin]. */
async function compare(
  gpu: Gpu,
  type: TensorType,
  outF: number,
  inF: number,
  rows: number,
  seed: number,
  epilogue: MatmulEpilogue = "store",
): Promise<[Float32Array, Float32Array]> {
  const rand = rng(seed);
  const w = randomTensor(rand, type, outF, inF);
  const x = randomF32(rand, rows * inF);
  const y0 = randomF32(rand, rows * outF);
  const m = uploadMatrix(gpu, w);
  const dimsU = gpu.device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
  gpu.device.queue.writeBuffer(dimsU, 0, new Uint32Array([rows, 0, 0, 0]));
  const xb = storage(gpu, x);
  const yb = storage(gpu, y0);
  const op = createMatmul(gpu, m, { dims: dimsU, x: xb, y: yb, rowsField: 0, epilogue });
  await runPass(gpu, (pass) => op.encode(pass, rows));
  const got = await readF32(gpu, yb, rows * outF);
  const dense = dequantize(w);
  const want = new Float32Array(rows * outF);
  for (let r = 0; r < rows; r++) {
    const out = matvec(new Float32Array(outF), dense, x.subarray(r * inF, (r + 1) * inF));
    for (let o = 0; o < outF; o++) want[r * outF + o] = (epilogue === "accumulate" ? y0[r * outF + o]! : 0) + out[o]!;
  }
  return [got, want];
}

for (const type of TYPES) {
  Deno.test(`createMatmul() ${type} matches dequantize + matvec for 1, 3 and 19 rows`, async () => {
    const gpu = await testGpu();
    for (const [outF, inF, rows] of [[40, 64, 1], [33, 96, 3], [17, 128, 19]] as const) {
      const [got, want] = await compare(gpu, type, outF, inF, rows, outF * 31 + rows);
      const err = relativeError(got, want);
      assertLess(err, 1e-5, `${type} [${outF}x${inF}] x ${rows} rows: relative error ${err}`);
    }
  });
}

Deno.test("createMatmul() accumulate adds W·x to y (the residual add)", async () => {
  const gpu = await testGpu();
  for (const type of TYPES) {
    const [got, want] = await compare(gpu, type, 24, 64, 5, 7, "accumulate");
    assertLess(relativeError(got, want), 1e-5, type);
  }
});

Deno.test("createMatmul() gives each row the same bits whatever the batch around it", async () => {
  const gpu = await testGpu();
  for (const type of TYPES) {
    const rand = rng(99);
    const w = uploadMatrix(gpu, randomTensor(rand, type, 20, 64));
    const x = randomF32(rand, 13 * 64);
    const run = async (xs: Float32Array, rows: number) => {
      const dims = gpu.device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
      gpu.device.queue.writeBuffer(dims, 0, new Uint32Array([rows, 0, 0, 0]));
      const y = storage(gpu, new Float32Array(rows * 20));
      const op = createMatmul(gpu, w, { dims, x: storage(gpu, xs), y, rowsField: 0 });
      await runPass(gpu, (pass) => op.encode(pass, rows));
      return readF32(gpu, y, rows * 20);
    };
    const batch = await run(x, 13);
    for (const r of [0, 5, 12]) {
      const alone = await run(x.slice(r * 64, (r + 1) * 64), 1);
      assert(alone.every((v, i) => v === batch[r * 20 + i]), `${type}: row ${r} alone differs from row ${r} in a batch of 13`);
    }
  }
});

Deno.test("createMatmul() splits a matrix larger than one binding into row chunks", async () => {
  // A 1 KiB binding cap forces 4-8 chunks per matrix here.
  const gpu = await acquireGpu({ maxBindingBytes: 1024 });
  for (const type of TYPES) {
    const rand = rng(5);
    const w = randomTensor(rand, type, 50, 64);
    assert(uploadMatrix(gpu, w).chunks.length > 1, `${type} should need several chunks`);
    const [got, want] = await compare(gpu, type, 50, 64, 3, 5);
    assertLess(relativeError(got, want), 1e-5, type);
  }
  gpu.device.destroy();
});
