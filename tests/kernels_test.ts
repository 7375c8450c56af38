import { assert, assertEquals, assertLess } from "@std/assert";
import { acquireGpu } from "../kernels/webgpu/device.ts";
import { createEmbedding } from "../kernels/webgpu/embedding.ts";
import { uploadMatrix } from "../kernels/webgpu/gpu_matrix.ts";
import { createRopeStore, uploadRopeTable } from "../kernels/webgpu/rope.ts";
import { LAST_SAMPLED_FLAG } from "../kernels/webgpu/step_meta.ts";
import { createSwiglu } from "../kernels/webgpu/swiglu.ts";
import { dequantize } from "../lib/model/dequantize.ts";
import type { ModelConfig } from "../lib/model/model_config.ts";
import { rope, swiglu } from "../kernels/reference/ops.ts";
import { BLOCK_LAYOUT, TENSOR_TYPES } from "../lib/model/tensor.ts";
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
  zeros,
} from "./_gpu.ts";

const row = (token: number, pos = 0, seq = 0, slot = 0) => ({ token, pos, seq, slot });

Deno.test("createEmbedding() gathers rows of every tensor type equal to dequantize(), including tokens left on the device by the sampler", async () => {
  // A 1 KiB binding cap splits the table, so rows come from several chunks.
  const gpu = await acquireGpu({ maxBindingBytes: 1024 });
  for (const type of TENSOR_TYPES) {
    const rand = rng(3);
    const vocab = 45;
    const dim = BLOCK_LAYOUT[type].elements === 256 ? 256 : 64;
    const table = randomTensor(rand, type, vocab, dim);
    const m = uploadMatrix(gpu, table);
    assert(m.chunks.length > 1, `${type}: expected a split table`);
    const lastSampled = storage(gpu, new Uint32Array([7, 44, 0]));
    const tokens = [3, 44, LAST_SAMPLED_FLAG | 1, 0, 22, LAST_SAMPLED_FLAG | 0];
    const meta = stepMeta(gpu, {
      rows: tokens.map((t) => row(t)),
      seqs: [],
      samples: [],
      blockTables: [],
    });
    const x = zeros(gpu, tokens.length * dim * 4);
    const op = createEmbedding(gpu, m, { dims: meta.dims, rows: meta.rows, lastSampled, x });
    await runPass(gpu, (pass) => op.encode(pass, tokens.length));
    const got = await readF32(gpu, x, tokens.length * dim);
    const dense = dequantize(table);
    const ids = [3, 44, 44, 0, 22, 7];
    ids.forEach((id, r) => {
      assertEquals(
        Array.from(got.subarray(r * dim, (r + 1) * dim)),
        Array.from(dense.subarray(id * dim, (id + 1) * dim)),
        `${type}: row ${r} should be token ${id}`,
      );
    });
  }
  gpu.device.destroy();
});

Deno.test("createSwiglu() matches the reference swiglu", async () => {
  const gpu = await testGpu();
  const rand = rng(12);
  const hidden = 172;
  const rows = 3;
  const g = randomF32(rand, rows * hidden, 6);
  const u = randomF32(rand, rows * hidden, 2);
  const meta = stepMeta(gpu, {
    rows: Array.from({ length: rows }, () => row(0)),
    seqs: [],
    samples: [],
    blockTables: [],
  });
  const gb = storage(gpu, g);
  const op = createSwiglu(gpu, hidden, { dims: meta.dims, gate: gb, up: storage(gpu, u) });
  await runPass(gpu, (pass) => op.encode(pass, rows));
  const got = await readF32(gpu, gb, rows * hidden);
  const want = swiglu(g.slice(), u);
  assertLess(relativeError(got, want), 1e-5);
});

function tinyConfig(ropeDim: number): ModelConfig {
  return {
    architecture: "llama",
    dim: 32,
    hiddenDim: 64,
    nLayers: 1,
    nHeads: 4,
    nKvHeads: 2,
    headDim: 8,
    vocabSize: 16,
    contextLength: 300,
    ropeTheta: 10000,
    ropeDim,
    rmsEps: 1e-5,
  };
}

for (const ropeDim of [8, 4]) {
  Deno.test(`createRopeStore() rotates q in place like the reference rope and stores rotated k and v at each row's slot (ropeDim ${ropeDim})`, async () => {
    const gpu = await testGpu();
    const config = tinyConfig(ropeDim);
    const rand = rng(13 + ropeDim);
    const qDim = 32;
    const kvDim = 16;
    const slots = 40;
    const rows = [row(0, 0, 0, 17), row(0, 1, 0, 3), row(0, 299, 0, 39), row(0, 128, 0, 0)];
    const stride = qDim + 2 * kvDim;
    const qkv = randomF32(rand, rows.length * stride);
    const meta = stepMeta(gpu, { rows, seqs: [], samples: [], blockTables: [] });
    const qkvb = storage(gpu, qkv);
    const kc = zeros(gpu, slots * kvDim * 4);
    const vc = zeros(gpu, slots * kvDim * 4);
    const op = createRopeStore(gpu, config, {
      dims: meta.dims,
      rows: meta.rows,
      table: uploadRopeTable(gpu, config, config.contextLength),
      qkv: qkvb,
      kCache: kc,
      vCache: vc,
    });
    await runPass(gpu, (pass) => op.encode(pass, rows.length));
    const got = await readF32(gpu, qkvb, rows.length * stride);
    const gotK = await readF32(gpu, kc, slots * kvDim);
    const gotV = await readF32(gpu, vc, slots * kvDim);
    rows.forEach((r, i) => {
      const at = i * stride;
      const wantQ = rope(qkv.slice(at, at + qDim), 4, 8, ropeDim, r.pos, 10000);
      const wantK = rope(qkv.slice(at + qDim, at + qDim + kvDim), 2, 8, ropeDim, r.pos, 10000);
      const v = qkv.subarray(at + qDim + kvDim, at + stride);
      assertLess(relativeError(got.subarray(at, at + qDim), wantQ), 1e-5, `q row ${i}`);
      assertLess(
        relativeError(gotK.subarray(r.slot * kvDim, (r.slot + 1) * kvDim), wantK),
        1e-5,
        `k row ${i}`,
      );
      assertEquals(Array.from(gotV.subarray(r.slot * kvDim, (r.slot + 1) * kvDim)), Array.from(v));
      // k and v stay as they were in the projection's output.
      assertEquals(
        Array.from(got.subarray(at + qDim, at + stride)),
        Array.from(qkv.subarray(at + qDim, at + stride)),
      );
    });
    // Slots no row names stay untouched.
    assert(gotK.subarray(kvDim, 2 * kvDim).every((x) => x === 0));
  });
}
