/**
 * The CPU engine (kernels/wasm) as a whole: against the reference engine, and the same bits
 * whatever shares a step, however many threads run it, and whichever kernel build runs.
 */
import { assert, assertEquals, assertRejects } from "@std/assert";
import { WasmEngine, type WasmEngineOptions } from "../kernels/wasm/wasm_engine.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { type Engine, GREEDY, type SamplingParams, type SeqInput } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import type { Model } from "../lib/model/weights.ts";
import { wasmHeap } from "../kernels/wasm/heap.ts";
import { compatPath } from "./harness/compat.ts";
import { modelFile } from "./harness/model_files.ts";
import { rng } from "./_gpu.ts";

const KV = { numBlocks: 48, blockSize: 16 };

async function withEngine<T>(
  model: Model,
  opts: WasmEngineOptions,
  f: (e: WasmEngine) => Promise<T>,
) {
  const e = await WasmEngine.create(model.config, model.weights, KV, opts);
  try {
    return await f(e);
  } finally {
    e.dispose();
  }
}

/** Greedy decode of one prompt for `steps` tokens; every step's logits. */
async function decode(engine: Engine, prompt: number[], steps: number): Promise<Float32Array[]> {
  const out: Float32Array[] = [];
  let next = prompt, pos = 0;
  for (let s = 0; s < steps; s++) {
    const r = await engine.step({
      stepId: s,
      returnLogits: true,
      seqs: [{
        seqId: 1,
        tokens: next,
        startPos: pos,
        blockTable: [0, 1, 2],
        sample: true,
        sampling: GREEDY,
      }],
    });
    out.push(r.sampled[0]!.logits!);
    pos += next.length;
    next = [r.sampled[0]!.token];
  }
  engine.release?.(1);
  return out;
}

/** 16 random prompts (seeded) prefilled together and decoded `steps` tokens; logits per prompt per step. */
async function batch(
  engine: Engine,
  prompts: number[][],
  steps: number,
  sampling: SamplingParams = GREEDY,
  seqBase = 0,
  blockBase = 0,
): Promise<Float32Array[][]> {
  const out = prompts.map(() => [] as Float32Array[]);
  const pos = prompts.map(() => 0);
  let next = prompts.map((p) => p);
  for (let step = 0; step < steps; step++) {
    const seqs: SeqInput[] = prompts.map((_, i) => ({
      seqId: seqBase + i,
      tokens: next[i]!,
      startPos: pos[i]!,
      blockTable: [blockBase + 2 * i, blockBase + 2 * i + 1],
      sample: true,
      sampling,
    }));
    const r = await engine.step({ stepId: step, seqs, returnLogits: true });
    r.sampled.forEach((s, i) => {
      out[i]!.push(s.logits!);
      pos[i]! += next[i]!.length;
    });
    next = r.sampled.map((s) => [s.token]);
  }
  prompts.forEach((_, i) => engine.release?.(seqBase + i));
  return out;
}

function randomPrompts(vocab: number, seed: number): number[][] {
  const rand = rng(seed);
  return Array.from(
    { length: 16 },
    () => Array.from({ length: 2 + Math.floor(rand() * 15) }, () => Math.floor(rand() * vocab)),
  );
}

const bits = (a: Float32Array) => Array.from(new Uint32Array(a.buffer, a.byteOffset, a.length));

Deno.test("cpu engine on stories260K (f32 weights) follows the reference engine: same greedy tokens over 40 steps, logits within 0.02 (f16 KV) and 1e-3 (f32 KV)", async () => {
  const model = await loadModel(modelFile("stories260K.bin"), {
    tokenizerPath: modelFile("tok512.bin"),
  });
  const reference = new CpuEngine(model.config, model.weights, KV);
  const prompt = [1, 403, 407, 261, 300];
  const expected = await decode(reference, prompt, 40);
  reference.dispose();
  for (const [kvDtype, tolerance] of [["f16", 0.02], ["f32", 1e-3]] as const) {
    const got = await withEngine(model, { kvDtype }, (e) => decode(e, prompt, 40));
    got.forEach((logits, s) => {
      let worst = 0, argA = 0, argB = 0;
      for (let i = 0; i < logits.length; i++) {
        worst = Math.max(worst, Math.abs(logits[i]! - expected[s]![i]!));
        if (logits[i]! > logits[argA]!) argA = i;
        if (expected[s]![i]! > expected[s]![argB]!) argB = i;
      }
      assertEquals(argA, argB, `${kvDtype} step ${s}: greedy token`);
      assert(worst <= tolerance, `${kvDtype} step ${s}: max |Δlogit| ${worst} > ${tolerance}`);
    });
  }
});

Deno.test("cpu engine on qwen2-like (Q5_0/Q8_0/Q4_K/Q6_K, biases): 16 prompts together give each prompt the logits it gets alone, bit for bit, greedy and seeded", async () => {
  const model = await loadModel(compatPath("qwen2-like-q4_k_m"), {
    allocate: (n) => wasmHeap().bytes(n, "test model"),
  });
  const prompts = randomPrompts(model.config.vocabSize, 11);
  const seeded: SamplingParams = { temperature: 0.9, topK: 40, topP: 0.95, minP: 0.02, seed: 77 };
  await withEngine(model, { maxSeqs: 16 }, async (e) => {
    for (const sampling of [GREEDY, seeded]) {
      const together = await batch(e, prompts, 3, sampling);
      for (let i = 0; i < prompts.length; i += 5) {
        const [alone] = await batch(e, [prompts[i]!], 3, sampling, 100 + i, 34);
        alone!.forEach((l, s) =>
          assertEquals(bits(l), bits(together[i]![s]!), `prompt ${i} step ${s}`)
        );
      }
    }
  });
});

Deno.test("cpu engine: 1, 2 and 3 threads and the plain-SIMD build give the same logits, bit for bit (llama3-like: Q4_K, Q6_K, rope_freqs)", async () => {
  const model = await loadModel(compatPath("llama3-like-q4_k_m"));
  const prompts = randomPrompts(model.config.vocabSize, 3).slice(0, 6);
  const runs: Float32Array[][][] = [];
  for (
    const opts of [{ threads: 1 }, { threads: 2 }, { threads: 3 }, {
      threads: 2,
      flavour: "simd" as const,
    }]
  ) {
    runs.push(await withEngine(model, { ...opts, maxSeqs: 16 }, (e) => batch(e, prompts, 3)));
  }
  for (const run of runs.slice(1)) {
    run.forEach((steps, i) =>
      steps.forEach((l, s) =>
        assertEquals(bits(l), bits(runs[0]![i]![s]!), `prompt ${i} step ${s}`)
      )
    );
  }
});

Deno.test("cpu engine: a 37-token prompt prefilled in one step, in pieces of 1 to 13, and token by token ends on the same logits, bit for bit (attention shares K/V reads across a prompt's rows)", async () => {
  const model = await loadModel(compatPath("qwen2-like-q4_k_m"));
  const rand = rng(23);
  const prompt = Array.from({ length: 37 }, () => Math.floor(rand() * model.config.vocabSize));
  const inPieces = async (e: WasmEngine, sizes: number[], seqId: number, blocks: number[]) => {
    let pos = 0, logits: Float32Array | undefined;
    for (const [i, n] of sizes.entries()) {
      const r = await e.step({
        stepId: i,
        returnLogits: true,
        seqs: [{
          seqId,
          tokens: prompt.slice(pos, pos + n),
          startPos: pos,
          blockTable: blocks,
          sample: true,
          sampling: GREEDY,
        }],
      });
      logits = r.sampled[0]!.logits!;
      pos += n;
    }
    assertEquals(pos, prompt.length);
    e.release(seqId);
    return bits(logits!);
  };
  await withEngine(model, { threads: 2 }, async (e) => {
    const whole = await inPieces(e, [37], 1, [0, 1, 2]);
    assertEquals(await inPieces(e, [1, 3, 7, 2, 13, 11], 2, [3, 4, 5]), whole, "in pieces");
    assertEquals(await inPieces(e, Array(37).fill(1), 3, [6, 7, 8]), whole, "token by token");
  });
});

Deno.test("cpu engine: a decode from the last sampled token equals one from the same literal token", async () => {
  const model = await loadModel(compatPath("qwen3-like-q4_k_m"));
  await withEngine(model, {}, async (e) => {
    const seq = (p: Partial<SeqInput>): SeqInput => ({
      seqId: 1,
      tokens: [],
      startPos: 0,
      blockTable: [0],
      sample: true,
      sampling: GREEDY,
      ...p,
    });
    const first = await e.step({ stepId: 0, seqs: [seq({ tokens: [1, 2, 3] })] });
    const viaLast = await e.step({
      stepId: 1,
      returnLogits: true,
      seqs: [seq({ useLastSampled: true, startPos: 3 })],
    });
    const literal = await e.step({
      stepId: 2,
      returnLogits: true,
      seqs: [seq({ tokens: [first.sampled[0]!.token], startPos: 3 })],
    });
    assertEquals(bits(viaLast.sampled[0]!.logits!), bits(literal.sampled[0]!.logits!));
  });
});

Deno.test("cpu engine refuses a step larger than its buffers, naming the limit", async () => {
  const model = await loadModel(modelFile("stories260K.gguf"));
  await withEngine(model, { maxBatchTokens: 8, maxSeqs: 2 }, async (e) => {
    assertEquals(e.limits, { maxSeqs: 2, maxBatchTokens: 8 });
    await assertRejects(
      () =>
        e.step({
          stepId: 4,
          seqs: [{
            seqId: 1,
            tokens: [1, 2, 3, 4, 5, 6, 7, 8, 9],
            startPos: 0,
            blockTable: [0],
            sample: true,
            sampling: GREEDY,
          }],
        }),
      Error,
      "Cannot run step 4: it has 9 token rows",
    );
  });
});

Deno.test("cpu engine reads weights in place when the model was loaded into its memory, and its KV cache is f16 by default", async () => {
  const heap = wasmHeap();
  const model = await loadModel(compatPath("tinyllama-like-q4_0"), {
    allocate: (n) => heap.bytes(n, "test model"),
  });
  assert(heap.owns(model.weights.layers[0]!.wq.data));
  const before = heap.used;
  await withEngine(model, {}, (e) => {
    const c = model.config;
    assertEquals(
      e.memory.kvCache,
      2 * c.nLayers * KV.numBlocks * KV.blockSize * c.nKvHeads * c.headDim * 2,
    );
    // Nothing the size of the weights was allocated: only the KV cache and step buffers.
    assert(
      heap.used - before < e.memory.kvCache + e.memory.buffers + (1 << 20),
      `${heap.used - before}`,
    );
    return Promise.resolve();
  });
});

Deno.test("cpu engine: a 1 GiB KV cache costs resident memory only for the blocks written, and memory.kvResident counts them", async () => {
  const model = await loadModel(compatPath("llama3-like-q4_k_m"));
  const c = model.config;
  const blockBytes = 2 * c.nLayers * 16 * c.nKvHeads * c.headDim * 2; // K and V, f16
  const kv = { numBlocks: Math.floor(2 ** 30 / blockBytes), blockSize: 16 };
  const rss = () =>
    Number(/VmRSS:\s+(\d+) kB/.exec(Deno.readTextFileSync("/proc/self/status"))![1]) * 1024;
  const before = rss();
  const e = await WasmEngine.create(c, model.weights, kv, {});
  try {
    assertEquals(e.memory.kvCache, kv.numBlocks * blockBytes);
    assertEquals(e.memory.kvResident, 0);
    // 40 tokens in blocks 7, 900 and the last: three blocks written, whatever their ids.
    const last = kv.numBlocks - 1;
    const tokens = Array.from({ length: 40 }, (_, i) => 1 + i);
    await e.step({
      stepId: 0,
      seqs: [{
        seqId: 1,
        tokens,
        startPos: 0,
        blockTable: [7, 900, last],
        sample: true,
        sampling: GREEDY,
      }],
    });
    assertEquals(e.memory.kvResident, 3 * blockBytes);
    // Rewriting block 7 adds nothing.
    await e.step({
      stepId: 1,
      seqs: [{
        seqId: 2,
        tokens: [5],
        startPos: 0,
        blockTable: [7],
        sample: true,
        sampling: GREEDY,
      }],
    });
    assertEquals(e.memory.kvResident, 3 * blockBytes);
    // The reservation itself stayed virtual: far less than the 1 GiB became resident.
    const grew = rss() - before;
    assert(grew < 2 ** 30 / 4, `RSS grew by ${grew} bytes for a 1 GiB cache`);
  } finally {
    e.dispose();
  }
});

// Caps that split these models (2 layers each for the compat files, 5 for stories260K) over
// several memories, with a 512-token context, maxBatchTokens 64 and maxSeqs 16: the engine
// says how many it used.
const SPLITS = [
  { file: () => compatPath("llama3-like-q4_k_m"), memoryBytes: 40 << 20, memories: 2 },
  {
    file: () => compatPath("qwen2-like-q4_k_m"),
    memoryBytes: (34 << 20) + (256 << 10),
    memories: 2,
  },
  { file: () => modelFile("stories260K.gguf"), memoryBytes: (2 << 20) + (128 << 10), memories: 3 },
];

Deno.test("cpu engine split over several memories by layer range gives the logits of one memory, bit for bit, alone and batched, on 1 and 2 threads", async () => {
  for (const { file, memoryBytes, memories } of SPLITS) {
    const model = await loadModel(file(), { contextLength: 512 });
    const prompts = randomPrompts(model.config.vocabSize, 5).slice(0, 4); // at most 64 rows
    const base = { maxBatchTokens: 64, maxSeqs: 16 };
    const whole = await withEngine(model, { ...base, threads: 2 }, async (e) => {
      assertEquals(e.memories, 1);
      return {
        together: await batch(e, prompts, 3),
        alone: await batch(e, [prompts[0]!], 3, GREEDY, 50, 30),
      };
    });
    for (const threads of [1, 2]) {
      await withEngine(model, { ...base, threads, memoryBytes }, async (e) => {
        const what = `${model.source} over ${memoryBytes} byte memories, ${threads} threads`;
        assertEquals(e.memories, memories, what);
        const together = await batch(e, prompts, 3);
        together.forEach((steps, i) =>
          steps.forEach((l, s) =>
            assertEquals(bits(l), bits(whole.together[i]![s]!), `${what}: prompt ${i} step ${s}`)
          )
        );
        const [alone] = await batch(e, [prompts[0]!], 3, GREEDY, 50, 30);
        alone!.forEach((l, s) =>
          assertEquals(bits(l), bits(whole.alone[0]![s]!), `${what}: alone, step ${s}`)
        );
      });
    }
  }
});

Deno.test("cpu engine refuses a memory cap that one layer with its tensors cannot fit in, naming the tensor and the sizes", async () => {
  const model = await loadModel(compatPath("llama3-like-q4_k_m"));
  await assertRejects(
    () =>
      WasmEngine.create(model.config, model.weights, KV, {
        maxBatchTokens: 64,
        maxSeqs: 16,
        memoryBytes: 32 << 20,
      }),
    Error,
    `Cannot split the model over CPU engine memories of ${
      32 << 20
    } bytes: layer 1 with the classifier 'token_embd.weight' (26933760 bytes) needs`,
  );
});
