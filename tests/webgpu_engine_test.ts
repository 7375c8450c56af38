import { assert, assertEquals, assertLess, assertRejects } from "@std/assert";
import { acquireGpu } from "../kernels/webgpu/device.ts";
import { WebGpuEngine } from "../kernels/webgpu/webgpu_engine.ts";
import {
  type Engine,
  GREEDY,
  type SamplingParams,
  type StepPlan,
  type StepResult,
} from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { referenceGenerate } from "../kernels/reference/reference_generate.ts";
import type { TensorType } from "../lib/model/tensor.ts";
import type { Model } from "../lib/model/weights.ts";
import { encodeTensor, relativeError, rng, testGpu } from "./_gpu.ts";
import { modelFile } from "./harness/model_files.ts";

const PROMPT = [1, 403, 407, 261, 378]; // "Once upon a time"
const KV = { numBlocks: 64, blockSize: 16 };

async function engines(model: Model, kv = KV): Promise<{ gpu: WebGpuEngine; cpu: CpuEngine }> {
  const gpu = await WebGpuEngine.create(model.config, model.weights, kv, {
    gpu: await testGpu(),
    kvDtype: "f32",
  });
  return { gpu, cpu: new CpuEngine(model.config, model.weights, kv) };
}

/** Generates greedily on both engines (the GPU feeding back its samples on the device) and compares. */
async function assertSameGeneration(model: Model, tokens: number, what: string): Promise<void> {
  const { gpu, cpu } = await engines(model);
  try {
    const want = await referenceGenerate(cpu, PROMPT, tokens, GREEDY, { returnLogits: true });
    const got = await referenceGenerate(gpu, PROMPT, tokens, GREEDY, {
      returnLogits: true,
      useLastSampled: true,
    });
    assertEquals(got.tokens, want.tokens, `${what}: greedy tokens`);
    want.logits.forEach((l, i) => {
      const err = relativeError(got.logits[i]!, l);
      assertLess(err, 1e-4, `${what}: logits of step ${i} differ by ${err} (relative)`);
    });
  } finally {
    gpu.dispose();
  }
}

for (
  const [file, tokens] of [
    ["stories260K.bin", 120],
    ["stories260K.gguf", 120],
    ["stories260K-q8_0.gguf", 120],
    // llama-quantize's files: BF16; Q4_1 and Q5_1 (with F16 and Q8_0 fallbacks); Q4_K, Q5_K
    // and Q6_K in the 32000-token tinyllama-like files (shorter: their classifier is large).
    ["compat/stories260K-bf16.gguf", 120],
    ["compat/stories260K-q4_1.gguf", 120],
    ["compat/stories260K-q5_1.gguf", 120],
    ["compat/tinyllama-like-q4_k_m.gguf", 8],
    ["compat/tinyllama-like-q5_k_m.gguf", 8],
  ] as const
) {
  Deno.test(`WebGpuEngine greedy-decodes ${tokens} tokens of ${file} exactly like CpuEngine, logits within 1e-4`, async () => {
    await assertSameGeneration(await loadModel(modelFile(file)), tokens, file);
  });
}

Deno.test("WebGpuEngine matches CpuEngine on a model mixing f32, f16, Q8_0 and Q4_0 tensors (unstacked q/k/v, gate/up)", async () => {
  const model = await loadModel(modelFile("stories260K.bin"));
  const w = model.weights;
  const as = (t: TensorType) => (x: typeof w.tokenEmbedding) => encodeTensor(x, t);
  const embedding = as("q8_0")(w.tokenEmbedding);
  const mixed: Model = {
    ...model,
    weights: {
      tokenEmbedding: embedding,
      output: embedding,
      outputNorm: w.outputNorm,
      layers: w.layers.map((l, i) => ({
        ...l,
        wq: as("q4_0")(l.wq),
        wk: as(i % 2 ? "f16" : "q8_0")(l.wk),
        wv: as("q4_0")(l.wv),
        wo: as("q8_0")(l.wo),
        wGate: as("f16")(l.wGate),
        wUp: as("q4_0")(l.wUp),
        wDown: as("f16")(l.wDown),
      })),
    },
  };
  await assertSameGeneration(mixed, 40, "mixed formats");
});

Deno.test("WebGpuEngine splits weights larger than one binding across several and still matches CpuEngine", async () => {
  const model = await loadModel(modelFile("stories260K.bin"));
  // A 32 KiB binding cap splits the embedding/classifier, qkv and gate/up matrices into chunks.
  const small = await acquireGpu({ maxBindingBytes: 32 * 1024 });
  const kv = { numBlocks: 16, blockSize: 16 };
  const gpu = await WebGpuEngine.create(model.config, model.weights, kv, {
    gpu: small,
    kvDtype: "f32",
    maxSeqs: 4,
    maxBatchTokens: 32,
  });
  try {
    const cpu = new CpuEngine(model.config, model.weights, kv);
    const want = await referenceGenerate(cpu, PROMPT, 20, GREEDY, { returnLogits: true });
    const got = await referenceGenerate(gpu, PROMPT, 20, GREEDY, {
      returnLogits: true,
      useLastSampled: true,
    });
    assertEquals(got.tokens, want.tokens);
    want.logits.forEach((l, i) => assertLess(relativeError(got.logits[i]!, l), 1e-4, `step ${i}`));
    await assertRejects(
      () =>
        WebGpuEngine.create(model.config, model.weights, { numBlocks: 17, blockSize: 16 }, {
          gpu: small,
          kvDtype: "f32",
          maxSeqs: 4,
          maxBatchTokens: 32,
        }),
      Error,
      "above the device's binding limit",
    );
  } finally {
    gpu.dispose();
    small.device.destroy();
  }
});

/** A seeded sampler per sequence: half greedy, half with temperature and filters. */
function samplingFor(i: number): SamplingParams {
  if (i % 2 === 0) return GREEDY;
  return {
    temperature: 0.6 + (i % 5) * 0.2,
    topK: [0, 40, 10][i % 3]!,
    topP: [1, 0.9, 0.8][i % 3]!,
    minP: i % 4 === 1 ? 0.05 : 0,
    seed: 1000 + i,
  };
}

interface Request {
  prompt: number[];
  sampling: SamplingParams;
  blockTable: number[];
}

/**
 * Runs requests through one engine as a scheduler would: request i arrives at step i, prompts
 * are prefilled in chunks of at most `chunk`, decodes feed back the last sampled token on the
 * device, and the order of sequences in each plan is shuffled. Every step is submitted before
 * any result is awaited. Returns each request's tokens and logprobs.
 */
async function runTogether(
  engine: Engine,
  reqs: Request[],
  newTokens: number,
  chunk: number,
  seqBase: number,
) {
  const shuffle = rng(77);
  const state = reqs.map(() => ({ pos: 0, sampled: 0 }));
  const pending: Promise<StepResult>[] = [];
  for (let step = 0; state.some((s) => s.sampled < newTokens); step++) {
    const seqs = [];
    for (let i = 0; i < reqs.length && i <= step; i++) {
      const r = reqs[i]!;
      const s = state[i]!;
      if (s.sampled >= newTokens) continue;
      const base = {
        seqId: seqBase + i,
        startPos: s.pos,
        blockTable: r.blockTable,
        sampling: r.sampling,
      };
      if (s.pos < r.prompt.length) {
        const tokens = r.prompt.slice(s.pos, s.pos + chunk);
        s.pos += tokens.length;
        const last = s.pos === r.prompt.length;
        if (last) s.sampled++;
        seqs.push({ ...base, tokens, sample: last });
      } else {
        s.pos++;
        s.sampled++;
        seqs.push({ ...base, tokens: [], useLastSampled: true, sample: true });
      }
    }
    seqs.sort(() => shuffle() - 0.5);
    pending.push(engine.step({ stepId: step, seqs }));
  }
  const out = reqs.map(() => ({ tokens: [] as number[], logprobs: [] as number[] }));
  for (const result of await Promise.all(pending)) {
    for (const s of result.sampled) {
      out[s.seqId - seqBase]!.tokens.push(s.token);
      out[s.seqId - seqBase]!.logprobs.push(s.logprob);
    }
  }
  return out;
}

// stories260K, and a K-quant model (Q4_K with Q6_K classifier and layer-1 tensors) whose
// 32000-token vocabulary needs the sampler's loop-limit-aware thread count on llvmpipe.
for (
  const [file, sampling, newTokens] of [
    ["stories260K.bin", samplingFor, 10],
    ["compat/tinyllama-like-q4_k_m.gguf", samplingFor, 4],
  ] as const
) {
  Deno.test(`WebGpuEngine is batch invariant on ${file}: 16 prompts decoded together (mixed prefill chunks and decodes, greedy and seeded) give each the bits it gets alone`, async () => {
    const model = await loadModel(modelFile(file));
    const { gpu, cpu } = await engines(model, { numBlocks: 100, blockSize: 16 });
    try {
      const rand = rng(5);
      const reqs: Request[] = Array.from({ length: 16 }, (_, i) => ({
        prompt: [
          1,
          ...Array.from(
            { length: 1 + Math.floor(rand() * 27) },
            () => 3 + Math.floor(rand() * 500),
          ),
        ],
        sampling: sampling(i),
        blockTable: [3 * i, 3 * i + 1, 3 * i + 2],
      }));
      const together = await runTogether(gpu, reqs, newTokens, 8, 0);
      for (let i = 0; i < reqs.length; i++) {
        // Alone: whole prompt in one step, other KV blocks, another sequence id.
        const r = { ...reqs[i]!, blockTable: [60, 61, 62] };
        const [alone] = await runTogether(gpu, [r], newTokens, 64, 100 + i);
        assertEquals(
          together[i],
          alone,
          `request ${i} (${JSON.stringify(r.sampling)}): together vs alone`,
        );
      }
      // The reference, fed the same batched plans, draws the same tokens.
      const reference = await runTogether(cpu, reqs, newTokens, 8, 0);
      assertEquals(together.map((t) => t.tokens), reference.map((t) => t.tokens));
    } finally {
      gpu.dispose();
    }
  });
}

Deno.test("WebGpuEngine gives the same next-token logits for a 70-token prefill whole or in chunks of 1, 7 and 64", async () => {
  const model = await loadModel(modelFile("stories260K.bin"));
  const { gpu, cpu } = await engines(model);
  try {
    const rand = rng(9);
    const prompt = [1, ...Array.from({ length: 69 }, () => 3 + Math.floor(rand() * 500))];
    const blockTable = [0, 1, 2, 3, 4];
    const prefill = (chunk: number, seqId: number): Promise<StepResult>[] => {
      const steps: Promise<StepResult>[] = [];
      for (let pos = 0; pos < prompt.length; pos += chunk) {
        const tokens = prompt.slice(pos, pos + chunk);
        const last = pos + chunk >= prompt.length;
        steps.push(gpu.step({
          stepId: pos,
          returnLogits: last,
          seqs: [{ seqId, tokens, startPos: pos, blockTable, sample: last, sampling: GREEDY }],
        }));
      }
      return steps;
    };
    const logitsOf = async (steps: Promise<StepResult>[]) =>
      (await Promise.all(steps)).at(-1)!.sampled[0]!.logits!;
    const whole = await logitsOf(prefill(70, 1));
    for (const chunk of [1, 7, 64]) {
      const got = await logitsOf(prefill(chunk, 2));
      assertEquals(Array.from(got), Array.from(whole), `chunks of ${chunk}`);
    }
    const plan: StepPlan = {
      stepId: 0,
      returnLogits: true,
      seqs: [{ seqId: 1, tokens: prompt, startPos: 0, blockTable, sample: true, sampling: GREEDY }],
    };
    const want = (await cpu.step(plan)).sampled[0]!.logits!;
    assertLess(relativeError(whole, want), 1e-4);
  } finally {
    gpu.dispose();
  }
});

Deno.test("WebGpuEngine returns hidden states after the final norm as CpuEngine does: every row or the last, in a step that samples nothing or beside a decode, chunked, and from stepMany", async () => {
  // stories260K on a CPU rasterizer also writes the sampled rows' final norm in the last down
  // projection's epilogue: the residual rows must still come back whole.
  const model = await loadModel(modelFile("stories260K.bin"));
  const { gpu, cpu } = await engines(model);
  const dim = model.config.dim;
  try {
    const embed = (seqId: number, tokens: number[], startPos: number, hidden: "all" | "last") => ({
      seqId,
      tokens,
      startPos,
      blockTable: [seqId],
      sample: false,
      sampling: GREEDY,
      hidden,
    });
    // An embedding of every row, nothing sampled.
    const alone: StepPlan = { stepId: 0, seqs: [embed(1, PROMPT, 0, "all")] };
    const [g0, c0] = await Promise.all([gpu.step(alone), cpu.step(alone)]);
    assertEquals(g0.sampled, []);
    assertEquals(g0.hidden!.map((h) => [h.seqId, h.startPos, h.rows.length]), [
      [1, 0, PROMPT.length * dim],
    ]);
    const err = relativeError(g0.hidden![0]!.rows, c0.hidden![0]!.rows);
    assertLess(err, 1e-5, `hidden rows differ from the reference's by ${err} (relative)`);

    // Beside a prefill that samples (and asks for its last row) and an embedding of its last
    // row only; then the first prompt again in two chunks, beside the sampled sequence's decode.
    const mixed: StepPlan = {
      stepId: 1,
      seqs: [
        { ...embed(2, PROMPT.slice(0, 3), 0, "last"), sample: true },
        embed(3, PROMPT, 0, "last"),
      ],
    };
    const [g1, c1] = await Promise.all([gpu.step(mixed), cpu.step(mixed)]);
    assertEquals(g1.sampled.map((s) => s.token), c1.sampled.map((s) => s.token));
    assertEquals(g1.hidden!.map((h) => [h.seqId, h.startPos, h.rows.length]), [
      [2, 2, dim],
      [3, PROMPT.length - 1, dim],
    ]);
    // The same rows, bit for bit, whatever shares the step.
    const lastRow = g0.hidden![0]!.rows.slice((PROMPT.length - 1) * dim);
    assertEquals([...g1.hidden![1]!.rows], [...lastRow]);
    const decode = {
      seqId: 2,
      tokens: [],
      useLastSampled: true,
      startPos: 3,
      blockTable: [2],
      sample: true,
      sampling: GREEDY,
    };
    const chunks = await Promise.all(gpu.stepMany([
      { stepId: 2, seqs: [decode, embed(4, PROMPT.slice(0, 2), 0, "all")] },
      { stepId: 3, seqs: [embed(4, PROMPT.slice(2), 2, "all")] },
    ]));
    assertEquals(chunks.map((r) => r.hidden!.map((h) => [h.seqId, h.startPos])), [[[4, 0]], [[
      4,
      2,
    ]]]);
    const joined = [...chunks[0]!.hidden![0]!.rows, ...chunks[1]!.hidden![0]!.rows];
    assertEquals(joined, [...g0.hidden![0]!.rows]);
    // Only known tokens have hidden states.
    await assertRejects(
      () => gpu.step({ stepId: 4, seqs: [{ ...decode, startPos: 4, hidden: "last" }] }),
      Error,
      "only known tokens have them",
    );
  } finally {
    gpu.dispose();
  }
});

Deno.test("WebGpuEngine.stepMany() runs k decode steps in one submit with the same tokens as k single steps", async () => {
  const model = await loadModel(modelFile("stories260K.bin"));
  const { gpu } = await engines(model);
  try {
    const seeded = { temperature: 1, topK: 0, topP: 0.95, minP: 0, seed: 7 };
    const decode = (seqId: number, startPos: number): StepPlan => ({
      stepId: startPos,
      seqs: [{
        seqId,
        tokens: [],
        useLastSampled: true,
        startPos,
        blockTable: [seqId],
        sample: true,
        sampling: seeded,
      }],
    });
    const prefill = (seqId: number) =>
      gpu.step({
        stepId: 0,
        seqs: [{
          seqId,
          tokens: PROMPT,
          startPos: 0,
          blockTable: [seqId],
          sample: true,
          sampling: seeded,
        }],
      });
    const first = [await prefill(1), await prefill(2)];
    const single = await Promise.all(
      Array.from({ length: 8 }, (_, k) => gpu.step(decode(1, 5 + k))),
    );
    const batched = await Promise.all(
      gpu.stepMany(Array.from({ length: 8 }, (_, k) => decode(2, 5 + k))),
    );
    assertEquals(first[1]!.sampled[0]!.token, first[0]!.sampled[0]!.token);
    assertEquals(batched.map((r) => r.sampled[0]!.token), single.map((r) => r.sampled[0]!.token));
  } finally {
    gpu.dispose();
  }
});

Deno.test("WebGpuEngine says how long each step kept it busy and how long its readback took: within the time from its call to its result, the readback no less than Deno's tick", async () => {
  const model = await loadModel(modelFile("stories260K.bin"));
  const { gpu } = await engines(model);
  try {
    const plan = (stepId: number, startPos: number, tokens: number[]): StepPlan => ({
      stepId,
      seqs: [{
        seqId: 1,
        tokens,
        ...(tokens.length === 0 ? { useLastSampled: true } : {}),
        startPos,
        blockTable: [0],
        sample: true,
        sampling: GREEDY,
      }],
    });
    const timed = async (run: () => Promise<StepResult>) => {
      const calledAt = performance.now();
      const r = await run();
      return { busy: r.busyMs!, readback: r.readbackMs!, elapsed: performance.now() - calledAt };
    };
    const steps = [timed(() => gpu.step(plan(0, 0, PROMPT)))];
    // Pipelined decodes: each one's busy time is its own, not its wait behind the others.
    for (let k = 0; k < 6; k++) {
      steps.push(timed(() => gpu.step(plan(1 + k, PROMPT.length + k, []))));
    }
    for (const { busy, readback, elapsed } of await Promise.all(steps)) {
      assert(busy > 0 && busy <= elapsed, `busy ${busy} ms of ${elapsed} ms`);
      // Deno resolves a mapping no sooner than its 10 ms tick after the call.
      assert(
        readback >= 9 && busy + readback <= elapsed,
        `readback ${readback} ms of ${elapsed} ms`,
      );
    }
  } finally {
    gpu.dispose();
  }
});

Deno.test("WebGpuEngine rejects bad plans with the reason, and keeps working", async () => {
  const model = await loadModel(modelFile("stories260K.bin"));
  const { gpu } = await engines(model, { numBlocks: 4, blockSize: 16 });
  try {
    const base = { seqId: 1, startPos: 0, sample: true, sampling: GREEDY };
    await assertRejects(
      () =>
        gpu.step({
          stepId: 1,
          seqs: [{ ...base, tokens: [], useLastSampled: true, blockTable: [0] }],
        }),
      Error,
      "earlier sampled step",
    );
    await assertRejects(
      () =>
        gpu.step({ stepId: 2, seqs: [{ ...base, tokens: Array(17).fill(5), blockTable: [0] }] }),
      Error,
      "needs 2 KV blocks",
    );
    await assertRejects(
      () => gpu.step({ stepId: 3, seqs: [{ ...base, tokens: [1], blockTable: [4] }] }),
      Error,
      "outside 0..3",
    );
    await assertRejects(
      () => gpu.step({ stepId: 4, seqs: [{ ...base, tokens: [512], blockTable: [0] }] }),
      Error,
      "outside the vocabulary",
    );
    const ok = await gpu.step({ stepId: 5, seqs: [{ ...base, tokens: PROMPT, blockTable: [0] }] });
    assertEquals(ok.sampled.length, 1);
  } finally {
    gpu.dispose();
  }
});

Deno.test("WebGpuEngine's f16 KV cache holds twice the blocks of a byte budget, and greedy-decodes 120 tokens of stories260K like the f32 reference, logprobs within 0.02 (a device without shader-f16, as on OpenGL ES, refuses it by name)", async () => {
  const model = await loadModel(modelFile("stories260K.bin"));
  const budget = { kvBytes: 1 << 20, blockSize: 16 };
  const device = await testGpu();
  if (!device.hasShaderF16) {
    await assertRejects(
      () =>
        WebGpuEngine.create(model.config, model.weights, budget, { gpu: device, kvDtype: "f16" }),
      Error,
      "an f16 KV cache needs the device's shader-f16 feature",
    );
    return;
  }
  const f16 = await WebGpuEngine.create(model.config, model.weights, budget, {
    gpu: device,
    kvDtype: "f16",
  });
  const f32 = await WebGpuEngine.create(model.config, model.weights, budget, {
    gpu: device,
    kvDtype: "f32",
  });
  try {
    // stories260K: 5 layers, 4 KV heads of 8: a 16-token block is 5 × 2 × 16 × 32 elements.
    assertEquals(f32.kv.numBlocks, Math.floor((1 << 20) / (5 * 2 * 16 * 32 * 4)));
    assertEquals(f16.kv.numBlocks, 2 * f32.kv.numBlocks);
    assertEquals(f16.memory.kvCache, f32.memory.kvCache);
    const cpu = new CpuEngine(model.config, model.weights, KV);
    const want = await referenceGenerate(cpu, PROMPT, 120, GREEDY, { returnLogits: true });
    const got = await referenceGenerate(f16, PROMPT, 120, GREEDY, {
      returnLogits: true,
      useLastSampled: true,
    });
    assertEquals(got.tokens, want.tokens);
    const logprob = (l: Float32Array, t: number) => {
      const max = Math.max(...l);
      return l[t]! - max - Math.log(l.reduce((s, v) => s + Math.exp(v - max), 0));
    };
    const worst = Math.max(
      ...want.tokens.map((t, i) =>
        Math.abs(logprob(got.logits[i]!, t) - logprob(want.logits[i]!, t))
      ),
    );
    console.log(
      `stories260K, f16 KV against the f32 reference: max |Δlogprob| ${
        worst.toFixed(5)
      } over 120 steps`,
    );
    assertLess(worst, 0.02);
  } finally {
    f16.dispose();
    f32.dispose();
  }
});

Deno.test("WebGpuEngine refuses to sample for a sequence when every last-sampled slot is held by a live one, instead of taking one over", async () => {
  const model = await loadModel(modelFile("stories260K.bin"));
  const gpu = await WebGpuEngine.create(model.config, model.weights, KV, {
    gpu: await testGpu(),
    kvDtype: "f32",
    lastSampledSlots: 2,
  });
  const cpu = new CpuEngine(model.config, model.weights, KV);
  try {
    const prefill = (seqId: number, stepId: number): StepPlan => ({
      stepId,
      seqs: [{
        seqId,
        tokens: PROMPT,
        startPos: 0,
        sample: true,
        sampling: GREEDY,
        blockTable: [seqId],
      }],
    });
    const first = await gpu.step(prefill(1, 1));
    await gpu.step(prefill(2, 2));
    await assertRejects(() => gpu.step(prefill(3, 3)), Error, "all 2 last-sampled slots are held");
    gpu.release(2);
    await gpu.step(prefill(3, 4));
    // Sequence 1 kept its slot: its next input is still its own sampled token.
    const decode = (e: Engine, useLastSampled: boolean) =>
      e.step({
        stepId: 5,
        seqs: [{
          seqId: 1,
          tokens: useLastSampled ? [] : [first.sampled[0]!.token],
          useLastSampled,
          startPos: PROMPT.length,
          sample: true,
          sampling: GREEDY,
          blockTable: [1],
        }],
      });
    await cpu.step(prefill(1, 1));
    const want = await decode(cpu, false);
    const got = await decode(gpu, true);
    assertEquals(got.sampled[0]!.token, want.sampled[0]!.token);
  } finally {
    gpu.dispose();
  }
});

Deno.test("WebGpuEngine's KV pools start small and grow when a step names a block past them, keeping what earlier steps wrote", async () => {
  const model = await loadModel(modelFile("stories260K.bin"));
  const kv = { numBlocks: 1000, blockSize: 16 };
  const { gpu, cpu } = await engines(model, kv);
  const c = model.config;
  const blockBytes = 2 * c.nLayers * kv.blockSize * c.nKvHeads * c.headDim * 4; // K and V, f32
  try {
    assertEquals(gpu.memory.kvCache, kv.numBlocks * blockBytes);
    const resident0 = gpu.memory.kvResident;
    assertLess(resident0, kv.numBlocks * blockBytes / 10);
    // Sequence 1 lives in block 3, sequence 2 in block 700: the second prefill grows the pools.
    const seqs = [{ seqId: 1, block: 3 }, { seqId: 2, block: 700 }];
    const both =
      (plan: (s: { seqId: number; block: number }, i: number) => StepPlan["seqs"][number]) =>
      (stepId: number, which = seqs): StepPlan => ({
        stepId,
        returnLogits: true,
        seqs: which.map(plan),
      });
    const prefill = (s: { seqId: number; block: number }) => ({
      seqId: s.seqId,
      tokens: PROMPT,
      startPos: 0,
      blockTable: [s.block],
      sample: true,
      sampling: GREEDY,
    });
    const steps: StepPlan[] = [both(prefill)(0, [seqs[0]!]), both(prefill)(1, [seqs[1]!])];
    for (const [i, plan] of steps.entries()) {
      const [g, r] = [await gpu.step(plan), await cpu.step(plan)];
      assertEquals(g.sampled.map((s) => s.token), r.sampled.map((s) => s.token));
      if (i === 0) assertEquals(gpu.memory.kvResident, resident0);
    }
    assertEquals(gpu.memory.kvResident, 701 * blockBytes);
    // Both decode on: sequence 1 reads the block it wrote before the pools were replaced.
    let next = [PROMPT, PROMPT].map(() => 0);
    for (let t = 0; t < 6; t++) {
      const plan = both((s, i) => ({
        seqId: s.seqId,
        tokens: [next[i]! || 403],
        startPos: PROMPT.length + t,
        blockTable: [s.block],
        sample: true,
        sampling: GREEDY,
      }))(2 + t);
      const [g, r] = [await gpu.step(plan), await cpu.step(plan)];
      assertEquals(
        g.sampled.map((s) => s.token),
        r.sampled.map((s) => s.token),
        `decode step ${t}`,
      );
      g.sampled.forEach((s, i) => {
        const err = relativeError(s.logits!, r.sampled[i]!.logits!);
        assertLess(err, 1e-4, `decode step ${t}, sequence ${s.seqId}: logits differ by ${err}`);
      });
      next = r.sampled.map((s) => s.token);
    }
    // Never past the budget: a step naming the last block grows to exactly the budget.
    await gpu.step({ stepId: 9, seqs: [{ ...prefill({ seqId: 3, block: 999 }) }] });
    assertEquals(gpu.memory.kvResident, kv.numBlocks * blockBytes);
  } finally {
    gpu.dispose();
  }
});

Deno.test("WebGpuEngine samples under token masks the tokens the reference engine does, in one batched step and in a second submitted before the first is read", async () => {
  const model = await loadModel(modelFile("stories260K.bin"), {
    tokenizerPath: modelFile("tok512.bin"),
  });
  const { gpu, cpu } = await engines(model);
  try {
    const rand = rng(12);
    const vocab = model.config.vocabSize;
    const maskOf = (n: number) => {
      const m = new Uint32Array(Math.ceil(vocab / 32));
      for (let k = 0; k < n; k++) {
        const id = Math.floor(rand() * vocab);
        m[id >>> 5]! |= 1 << (id & 31);
      }
      return m;
    };
    const seqs = Array.from({ length: 6 }, (_, i) => ({
      seqId: i,
      tokens: [1, 403 + i, 407, 261],
      startPos: 0,
      blockTable: [i],
      sample: true,
      sampling: { temperature: i % 2 === 0 ? 0 : 1, topK: 0, topP: 1, minP: 0, seed: 40 + i },
      // Masked and unmasked sequences share the step.
      ...(i === 3 ? {} : { tokenMask: maskOf(2 + i) }),
    }));
    const first = { stepId: 0, seqs };
    const second = {
      stepId: 1,
      seqs: seqs.map((s) => ({
        ...s,
        tokens: [s.tokens[0]!, 300 + s.seqId],
        blockTable: [10 + s.seqId],
        tokenMask: maskOf(3),
      })),
    };
    const [a1, a2] = [gpu.step(first), gpu.step(second)];
    const [r1, r2] = [await cpu.step(first), await cpu.step(second)];
    for (const [got, want, plan] of [[await a1, r1, first], [await a2, r2, second]] as const) {
      plan.seqs.forEach((s, i) => {
        assertEquals(got.sampled[i]!.token, want.sampled[i]!.token, `step ${plan.stepId} seq ${i}`);
        const t = got.sampled[i]!.token;
        if (s.tokenMask) assertEquals((s.tokenMask[t >>> 5]! >>> (t & 31)) & 1, 1);
      });
    }
  } finally {
    gpu.dispose();
    cpu.dispose();
  }
});

Deno.test("WebGpuEngine.lastStepDispatches counts a decode step of stories260K as n_layers × per-layer + fixed (4 + 3 on a CPU rasterizer, 5 + 4 on a GPU), and one more for a logit bias", async () => {
  const model = await loadModel(modelFile("stories260K.bin"));
  const { gpu: engine } = await engines(model);
  try {
    // Per layer: q|k|v (norm, RoPE and the KV store fused), attention (on a CPU rasterizer in
    // wo's prologue: stories260K's 64 outputs fit one lane workgroup), wo (+ residual), gate|up
    // (norm and SwiGLU fused), down (+ residual). Per step: the embedding gather, the final
    // norm of the sampled rows (once, not in each of the classifier's workgroups; on a CPU
    // rasterizer in the last down projection's epilogue, whose one workgroup spans the 64
    // outputs too), the classifier and the sampler.
    const perLayer = engine.gpu.cpuRasterizer ? 4 : 5;
    const want = model.config.nLayers * perLayer + (engine.gpu.cpuRasterizer ? 3 : 4);
    const seq = { seqId: 1, blockTable: [0], sample: true, sampling: GREEDY };
    await engine.step({ stepId: 0, seqs: [{ ...seq, tokens: PROMPT, startPos: 0 }] });
    await engine.step({
      stepId: 1,
      seqs: [{ ...seq, tokens: [], useLastSampled: true, startPos: 5 }],
    });
    assertEquals(
      engine.lastStepDispatches,
      want,
      `dispatches of a decode step, ${model.config.nLayers} layers`,
    );
    const adjust = {
      ids: Int32Array.of(300),
      bias: Float32Array.of(2),
      penalty: Float32Array.of(1),
      subtract: Float32Array.of(0),
    };
    await engine.step({
      stepId: 2,
      seqs: [{ ...seq, tokens: [], useLastSampled: true, startPos: 6, adjust }],
    });
    assertEquals(
      engine.lastStepDispatches,
      want + 1,
      "a decode step with a logit bias adds the adjust kernel",
    );
  } finally {
    engine.dispose();
  }
});
