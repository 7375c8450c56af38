import { assertAlmostEquals, assertEquals, assertThrows } from "@std/assert";
import { bindAll } from "../kernels/webgpu/device.ts";
import {
  createSampler,
  type SampleLayout,
  samplerThreads,
  WGSL_RNG,
} from "../kernels/webgpu/sample.ts";
import type { SampleMeta } from "../kernels/webgpu/step_meta.ts";
import type { SamplingParams } from "../lib/engine/engine.ts";
import { hash32 } from "../lib/util/rng.ts";
import { logSoftmaxAt, MIN_TEMPERATURE, sample } from "../lib/engine/sampling.ts";
import { maskLogits } from "../lib/engine/token_mask.ts";
import { randomF32, readU32, rng, runPass, stepMeta, storage, testGpu, zeros } from "./_gpu.ts";

Deno.test("WGSL hash32 gives lib/rng.ts's bits", async () => {
  const gpu = await testGpu();
  const pipeline = gpu.pipeline(
    `${WGSL_RNG}
@group(0) @binding(0) var<storage, read> inp: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read_write> outp: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
  if (id.x < arrayLength(&outp)) { outp[id.x] = hash32(inp[id.x].x, inp[id.x].y); }
}`,
    "hash32 test",
  );
  const rand = rng(1);
  const pairs = Array.from({ length: 256 }, (_, i) => [
    i < 8 ? [0, 0xffffffff, 1, 42][i % 4]! : Math.floor(rand() * 2 ** 32),
    i < 8 ? i : Math.floor(rand() * 2 ** 32),
  ]);
  const out = zeros(gpu, pairs.length * 4);
  const group = bindAll(gpu, pipeline, [storage(gpu, new Uint32Array(pairs.flat())), out]);
  await runPass(gpu, (pass) => {
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, group);
    pass.dispatchWorkgroups(pairs.length / 64);
  });
  const got = await readU32(gpu, out, pairs.length);
  assertEquals(Array.from(got), pairs.map(([s, c]) => hash32(s!, c!)));
});

const PARAMS: SamplingParams[] = [
  { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 },
  { temperature: 1, topK: 0, topP: 1, minP: 0, seed: 1 },
  { temperature: 0.7, topK: 40, topP: 1, minP: 0, seed: 2 },
  { temperature: 1, topK: 0, topP: 0.9, minP: 0, seed: 3 },
  { temperature: 1.3, topK: 0, topP: 1, minP: 0.05, seed: 4 },
  { temperature: 0.8, topK: 50, topP: 0.95, minP: 0.02, seed: 5 },
  { temperature: 2, topK: 1, topP: 1, minP: 0, seed: 6 },
  { temperature: 1, topK: 3, topP: 0.5, minP: 0, seed: 7 },
  { temperature: 1, topK: 0, topP: 0, minP: 0, seed: 8 },
  { temperature: 0.5, topK: 0, topP: 1, minP: 1, seed: 9 },
];

/** Both layouts run on every device, whichever one the device picks by default. */
const LAYOUTS: SampleLayout[] = ["wide", "narrow"];

/** Samples `rows` logit vectors on the GPU, each with PARAMS[i % n] and a distinct seed and position. */
async function compareWithReference(
  vocab: number,
  logits: Float32Array,
  rows: number,
  layout: SampleLayout,
  paramSet: readonly SamplingParams[] = PARAMS,
): Promise<void> {
  const gpu = await testGpu();
  const metas: SampleMeta[] = [];
  const params: SamplingParams[] = [];
  for (let i = 0; i < rows; i++) {
    const p = { ...paramSet[i % paramSet.length]!, seed: 1000 + i * 17 };
    params.push(p);
    metas.push({
      row: i,
      lastSlot: i,
      seed: p.seed,
      position: 5 + i,
      temperature: p.temperature,
      topK: p.topK,
      topP: p.topP,
      minP: p.minP,
    });
  }
  const meta = stepMeta(gpu, { rows: [], seqs: [], samples: metas, blockTables: [] });
  const out = zeros(gpu, rows * 8);
  const lastSampled = zeros(gpu, rows * 4);
  const op = createSampler(gpu, vocab, {
    dims: meta.dims,
    samples: meta.samples,
    logits: storage(gpu, logits),
    out,
    lastSampled,
    layout,
  });
  await runPass(gpu, (pass) => op.encode(pass, rows));
  const got = await readU32(gpu, out, rows * 2);
  const last = await readU32(gpu, lastSampled, rows);
  const lp = new Float32Array(got.buffer);
  for (let i = 0; i < rows; i++) {
    const want = sample(logits.subarray(i * vocab, (i + 1) * vocab), params[i]!, 5 + i);
    const what = `${layout} row ${i} ${JSON.stringify(params[i])}`;
    assertEquals(got[2 * i], want.token, what);
    assertEquals(last[i], want.token, `${what}: last-sampled table`);
    assertAlmostEquals(lp[2 * i + 1]!, want.logprob, 1e-4, what);
  }
}

Deno.test("createSampler() draws the reference sampler's tokens and logprobs (greedy, temperature, top-k, top-p, min-p)", async () => {
  const rand = rng(21);
  for (const vocab of [512, 1000]) {
    const rows = 32;
    const logits = randomF32(rand, rows * vocab, 4);
    for (const layout of LAYOUTS) await compareWithReference(vocab, logits, rows, layout);
  }
});

Deno.test("createSampler() draws the reference's tokens on real vocabulary sizes (32000, 151936), within llvmpipe's loop limit", async () => {
  // llvmpipe ends an invocation's loops after 65535 iterations in all; with 8 threads over
  // 32000 tokens (or 64 over 151936) the filtered searches needed ~104000 (~66000) and came
  // back with wrong ids, even the vocabulary size. Both layouts, every filter of PARAMS.
  const rand = rng(23);
  for (const vocab of [32000, 151936]) {
    const rows = PARAMS.length;
    const logits = randomF32(rand, rows * vocab, 4);
    for (const layout of LAYOUTS) await compareWithReference(vocab, logits, rows, layout);
  }
});

Deno.test("samplerThreads() refuses a vocabulary no thread count keeps within the loop limit", () => {
  assertThrows(
    () => samplerThreads(4_000_000, 8),
    Error,
    "a vocabulary of 4000000 tokens needs more than",
  );
});

Deno.test("createSampler() breaks ties toward the lower token id, like the reference", async () => {
  const rand = rng(22);
  const vocab = 300;
  const rows = 24;
  // Logits on a coarse grid: many exact ties, including at the top.
  const logits = Float32Array.from({ length: rows * vocab }, () => Math.round(rand() * 6) / 2);
  for (const layout of LAYOUTS) await compareWithReference(vocab, logits, rows, layout);
});

Deno.test("createSampler() treats a temperature below MIN_TEMPERATURE as greedy and samples at it, like the reference", async () => {
  const rand = rng(23);
  const vocab = 512;
  const rows = 16;
  const base = { topK: 0, topP: 1, minP: 0, seed: 0 };
  const tiny: SamplingParams[] = [1e-38, 1e-320, 9.9e-6, MIN_TEMPERATURE].map((temperature) => ({
    ...base,
    temperature,
  }));
  // Random logits (tiny temperatures must give the argmax, not the least likely token)...
  await compareWithReference(vocab, randomF32(rand, rows * vocab, 4), rows, "wide", tiny);
  // ...and rows whose top logits tie, where only a sampler at MIN_TEMPERATURE draws the second.
  const tied = Float32Array.from({ length: rows * vocab }, (_, i) => (i % vocab < 2 ? 3 : -3));
  for (const layout of LAYOUTS) await compareWithReference(vocab, tied, rows, layout, tiny);
});

Deno.test("createSampler() with token masks draws the reference's token over the allowed ids, logprob under the raw logits", async () => {
  const gpu = await testGpu();
  const rand = rng(31);
  for (const vocab of [1000, 32000]) {
    const rows = PARAMS.length * 2;
    const logits = randomF32(rand, rows * vocab, 6);
    const words = Math.ceil(vocab / 32);
    // Flags, then one row of words per sample; every other sample unmasked.
    const maskData = new Uint32Array(rows + rows * words);
    const masks: (Uint32Array | undefined)[] = [];
    for (let i = 0; i < rows; i++) {
      if (i % 2 === 1) {
        masks.push(undefined);
        continue;
      }
      const m = new Uint32Array(words);
      for (let k = 0; k < 1 + (i % 7) * 5; k++) {
        const id = Math.floor(rand() * vocab);
        m[id >>> 5]! |= 1 << (id & 31);
      }
      masks.push(m);
      maskData[i] = 1;
      maskData.set(m, rows + i * words);
    }
    const metas: SampleMeta[] = [];
    const params: SamplingParams[] = [];
    for (let i = 0; i < rows; i++) {
      const p = { ...PARAMS[i % PARAMS.length]!, seed: 500 + i };
      params.push(p);
      metas.push({ row: i, lastSlot: i, position: 9 + i, ...p });
    }
    const meta = stepMeta(gpu, { rows: [], seqs: [], samples: metas, blockTables: [] });
    const out = zeros(gpu, rows * 8);
    const op = createSampler(gpu, vocab, {
      dims: meta.dims,
      samples: meta.samples,
      logits: storage(gpu, logits),
      out,
      lastSampled: zeros(gpu, rows * 4),
      masks: { buffer: storage(gpu, maskData), rows },
    });
    await runPass(gpu, (pass) => op.encode(pass, rows));
    const got = await readU32(gpu, out, rows * 2);
    const lp = new Float32Array(got.buffer);
    for (let i = 0; i < rows; i++) {
      const row = logits.subarray(i * vocab, (i + 1) * vocab);
      const m = masks[i];
      const token = sample(m ? maskLogits(row, m) : row, params[i]!, 9 + i).token;
      const what = `vocab ${vocab} row ${i} ${JSON.stringify(params[i])} masked ${m !== undefined}`;
      assertEquals(got[2 * i], token, what);
      if (m) assertEquals((m[token >>> 5]! >>> (token & 31)) & 1, 1, what);
      assertAlmostEquals(lp[2 * i + 1]!, logSoftmaxAt(row, token), 1e-4, what);
    }
  }
});
