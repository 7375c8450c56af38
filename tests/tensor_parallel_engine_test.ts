/**
 * Tensor-parallel ranks in one process: CPU engines that each compute their rows of every
 * layer matrix and gather the others' columns (LocalTpGroup), grouped by the
 * TensorParallelEngine, against the one-process CPU engine.
 */
import { assertEquals, assertRejects, assertThrows } from "@std/assert";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { LocalTpGroup, tpShard } from "../kernels/wasm/tp_shard.ts";
import { tpPlacement } from "../kernels/wasm/tp_placement.ts";
import { TensorParallelEngine } from "../lib/engine/tensor_parallel_engine.ts";
import { type GatherLink, HubGather } from "../lib/cluster/tp_link.ts";
import type { StageLink } from "../lib/engine/stage_link.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import type { ModelConfig } from "../lib/model/model_config.ts";
import type { ModelWeights } from "../lib/model/weights.ts";
import { compatPath } from "./harness/compat.ts";
import { modelFile } from "./harness/model_files.ts";
import { randomPrompts, runSteps, SEEDED } from "./harness/engine_steps.ts";

const KV = { numBlocks: 48, blockSize: 16 };
const LIMITS = { maxBatchTokens: 256, maxSeqs: 16 };

/** `size` rank engines over one load of the model, gathering through one LocalTpGroup. */
async function ranks(config: ModelConfig, weights: ModelWeights, size: number) {
  const group = new LocalTpGroup(size);
  const out: WasmEngine[] = [];
  for (let r = 0; r < size; r++) {
    out.push(
      await WasmEngine.create(config, weights, KV, {
        ...LIMITS,
        threads: 1,
        tensorParallel: { shard: tpShard(config, r, size), exchange: group.member(r) },
      }),
    );
  }
  return out;
}

// stories260K: 4 KV heads (TP 2 and 4 split them); llama3-like: 1 KV head, 4 query heads (each
// rank keeps the KV head and takes its share of the query heads); qwen2-like: q/k/v biases.
const CASES = [
  { file: () => modelFile("stories260K.gguf"), sizes: [2, 4] },
  { file: () => compatPath("llama3-like-q4_k_m"), sizes: [2] },
  { file: () => compatPath("qwen2-like-q4_k_m"), sizes: [2] },
];

Deno.test("tensor-parallel ranks in one process give the one-process engine's logits bit for bit and its tokens, greedy and seeded, at 1 and 16 sequences", async () => {
  for (const { file, sizes } of CASES) {
    const path = file();
    const m = await loadModel(path, { contextLength: 512 });
    const single = await WasmEngine.create(m.config, m.weights, KV, { ...LIMITS, threads: 1 });
    for (const size of sizes) {
      const tp = new TensorParallelEngine(m.config, KV, await ranks(m.config, m.weights, size));
      for (const n of [1, 16]) {
        for (const sampling of [GREEDY, SEEDED]) {
          const prompts = randomPrompts(n, m.config.vocabSize);
          const want = await runSteps(single, prompts, 4, sampling);
          const got = await runSteps(tp, prompts, 4, sampling);
          const what = `${path} TP ${size}, ${n} seqs, temperature ${sampling.temperature}`;
          assertEquals(got.tokens, want.tokens, what);
          assertEquals(got.logits, want.logits, what);
        }
      }
      tp.dispose();
    }
    single.dispose();
  }
});

Deno.test("a tensor-parallel rank holds its rows of the layer matrices and its KV heads' cache only, and does not step alone", async () => {
  const m = await loadModel(modelFile("stories260K.gguf"), { contextLength: 512 });
  const full = await WasmEngine.create(m.config, m.weights, KV, { ...LIMITS, threads: 1 });
  const [r0, r1] = await ranks(m.config, m.weights, 2);
  // 4 KV heads over 2 ranks: half the cache each.
  assertEquals(r0!.memory.kvCache, full.memory.kvCache / 2);
  assertEquals(r1!.memory.kvCache, full.memory.kvCache / 2);
  // stories260K is all f32 (4 bytes a value), its classifier untied. Every rank embeds, so holds
  // the embedding, and the norms; rank 1 holds half of each layer matrix's rows and no classifier.
  const { dim, hiddenDim, nLayers, vocabSize } = m.config;
  const qDim = m.config.nHeads * m.config.headDim, kvDim = m.config.nKvHeads * m.config.headDim;
  const matrices = nLayers * (2 * qDim * dim + 2 * kvDim * dim + 3 * hiddenDim * dim) * 4;
  const norms = (2 * nLayers + 1) * dim * 4, embedding = vocabSize * dim * 4;
  assertEquals(full.memory.weights, matrices + norms + 2 * embedding);
  assertEquals(r1!.memory.weights, matrices / 2 + norms + embedding);
  assertEquals(r0!.memory.weights, matrices / 2 + norms + 2 * embedding);
  const plan = {
    stepId: 0,
    seqs: [{
      seqId: 1,
      tokens: [1, 2],
      startPos: 0,
      blockTable: [0],
      sample: true,
      sampling: GREEDY,
    }],
  };
  await assertRejects(() => r1!.step(plan), Error, "tensor-parallel rank 1 of 2");
  r0!.dispose();
  r1!.dispose();
  full.dispose();
});

Deno.test("tensor-parallel sizes the KV heads cannot be split into are refused, naming the size", () => {
  const config = { dim: 256, hiddenDim: 2560, nHeads: 4, nKvHeads: 1 };
  assertThrows(() => tpShard(config, 0, 3), Error, "Invalid tensor-parallel size 3");
  assertThrows(() => tpShard(config, 0, 8), Error, "Invalid tensor-parallel size 8");
  assertThrows(() => tpShard(config, 2, 2), Error, "Invalid tensor-parallel rank 2");
  assertEquals(tpShard(config, 3, 4).heads, { start: 3, end: 4 });
});

Deno.test("a rank that fails its step ends the group's step with its error, rather than leaving rank 0 waiting at a gather, and the steps after it fail too", async () => {
  const m = await loadModel(modelFile("stories260K.gguf"), { contextLength: 512 });
  const hub = new HubGather();
  const r0 = await WasmEngine.create(m.config, m.weights, KV, {
    ...LIMITS,
    threads: 1,
    tensorParallel: { shard: tpShard(m.config, 0, 2), exchange: hub },
  });
  // Rank 1 as the head sees a remote rank that answers with an error and sends no gather.
  const failing: StageLink & GatherLink = {
    stage: { start: 0, end: m.config.nLayers },
    stepStage: (plan) => Promise.reject(new Error(`rank 1 failed step ${plan.stepId}`)),
    sendGather: () => {},
    dispose: () => {},
  };
  hub.attach([failing]);
  const tp = new TensorParallelEngine(m.config, KV, [r0, failing], LIMITS, (e) => hub.fail(e));
  const plan = (stepId: number) => ({
    stepId,
    seqs: [{
      seqId: 1,
      tokens: [1, 2],
      startPos: 0,
      blockTable: [0],
      sample: true,
      sampling: GREEDY,
    }],
  });
  await assertRejects(() => tp.step(plan(0)), Error, "rank 1 failed step 0");
  await assertRejects(() => tp.step(plan(1)), Error, "rank 1 failed step");
  tp.dispose();
});

Deno.test("each rank loaded with tpPlacement reads only its rows of the layer matrices (the others stay zero) and no classifier past rank 0, and the group still gives the one-process logits bit for bit (llama3-like, qwen2-like)", async () => {
  for (const path of [compatPath("llama3-like-q4_k_m"), compatPath("qwen2-like-q4_k_m")]) {
    const whole = await loadModel(path, { contextLength: 512 });
    const single = await WasmEngine.create(whole.config, whole.weights, KV, {
      ...LIMITS,
      threads: 1,
    });
    const group = new LocalTpGroup(2);
    const read: number[] = [];
    const ranks = [];
    for (let r = 0; r < 2; r++) {
      let total = 0;
      const m = await loadModel(path, {
        contextLength: 512,
        placeTensors: tpPlacement(r, 2),
        onProgress: (_done, t) => (total = t ?? total),
      });
      read.push(total);
      const shard = tpShard(m.config, r, 2);
      // ffn_down's rows are the residual's columns: rank r read rows dimRows, nothing else.
      const down = m.weights.layers[0]!.wDown, full = whole.weights.layers[0]!.wDown;
      const rb = down.data.byteLength / m.config.dim;
      const { start, end } = shard.dimRows;
      assertEquals(
        down.data.subarray(start * rb, end * rb),
        full.data.subarray(start * rb, end * rb),
      );
      const others = [...down.data.subarray(0, start * rb), ...down.data.subarray(end * rb)];
      assertEquals(others.every((b) => b === 0), true, `${path} rank ${r}: unread rows`);
      ranks.push(
        await WasmEngine.create(m.config, m.weights, KV, {
          ...LIMITS,
          threads: 1,
          tensorParallel: { shard, exchange: group.member(r) },
        }),
      );
    }
    const fileBytes = (await Deno.stat(path)).size;
    // Both tied files: every rank reads the embedding (most of these files), half of the layers.
    assertEquals(read[1]! < fileBytes, true, `${read[1]} of ${fileBytes}`);
    const tp = new TensorParallelEngine(whole.config, KV, ranks, LIMITS);
    for (const n of [1, 16]) {
      const prompts = randomPrompts(n, whole.config.vocabSize);
      const want = await runSteps(single, prompts, 3, GREEDY);
      const got = await runSteps(tp, prompts, 3, GREEDY);
      assertEquals(got.tokens, want.tokens, `${path}, ${n} seqs`);
      assertEquals(got.logits, want.logits, `${path}, ${n} seqs`);
    }
    tp.dispose();
    single.dispose();
  }
});
