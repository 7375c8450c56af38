/**
 * Pipeline stages in one process: CPU engines of layer ranges, each loaded with only its own
 * tensors, chained by the PipelineEngine, against the one-process CPU engine.
 */
import { assert, assertEquals, assertRejects, assertThrows } from "@std/assert";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { stagePlacement } from "../kernels/wasm/stage_placement.ts";
import { PipelineEngine, splitEvenly } from "../lib/engine/pipeline_engine.ts";
import type { LayerRange } from "../lib/engine/stage_link.ts";
import { type Engine, GREEDY } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { compatPath } from "./harness/compat.ts";
import { modelFile } from "./harness/model_files.ts";
import { bits, randomPrompts, runSteps, SEEDED } from "./harness/engine_steps.ts";

const KV = { numBlocks: 48, blockSize: 16 };
const LIMITS = { maxBatchTokens: 256, maxSeqs: 16 };

/** Stage engines of `ranges`, each from a load of `path` that reads only its range's tensors. */
async function stageEngines(path: string, ranges: LayerRange[]): Promise<WasmEngine[]> {
  const out: WasmEngine[] = [];
  for (const r of ranges) {
    const m = await loadModel(path, { contextLength: 512, placeTensors: stagePlacement(r, path) });
    out.push(
      await WasmEngine.create(m.config, m.weights, KV, { ...LIMITS, threads: 1, layers: r }),
    );
  }
  return out;
}

const CASES = [
  { file: () => compatPath("llama3-like-q4_k_m"), splits: [[0, 1, 2]] },
  { file: () => compatPath("qwen2-like-q4_k_m"), splits: [[0, 1, 2]] },
  { file: () => modelFile("stories260K.gguf"), splits: [[0, 2, 5], [0, 1, 3, 5]] },
];

Deno.test("pipeline stages in one process, each loaded with only its layers, give the one-process engine's logits bit for bit and its tokens, greedy and seeded, at 1 and 16 sequences", async () => {
  for (const { file, splits } of CASES) {
    const path = file();
    const whole = await loadModel(path, { contextLength: 512 });
    const single = await WasmEngine.create(whole.config, whole.weights, KV, {
      ...LIMITS,
      threads: 1,
    });
    for (const cuts of splits) {
      const ranges = cuts.slice(1).map((end, i) => ({ start: cuts[i]!, end }));
      // As many micro-batches as stages: each step's sequences go down the chain in groups.
      const pp = new PipelineEngine(
        whole.config,
        KV,
        await stageEngines(path, ranges),
        LIMITS,
        ranges.length,
      );
      for (const n of [1, 16]) {
        for (const sampling of [GREEDY, SEEDED]) {
          const prompts = randomPrompts(n, whole.config.vocabSize);
          const want = await runSteps(single, prompts, 4, sampling);
          const got = await runSteps(pp, prompts, 4, sampling);
          const what = `${path} split at ${cuts}, ${n} seqs, temperature ${sampling.temperature}`;
          assertEquals(got.tokens, want.tokens, what);
          assertEquals(got.logits, want.logits, what);
        }
      }
      pp.dispose();
    }
    single.dispose();
  }
});

Deno.test("a stage load reads only its layers' tensors (and the embedding on the first, the classifier on the last); its engine holds only their weights and KV cache", async () => {
  const path = modelFile("stories260K.gguf");
  const whole = await loadModel(path, { contextLength: 512 });
  const mid = await loadModel(path, { placeTensors: stagePlacement({ start: 2, end: 4 }, path) });
  const read = (m: typeof mid, name: string) =>
    [...Object.entries(m.weights.layers[Number(name)] ?? {})].every(([, t]) => t.data.length > 0);
  assertEquals([0, 1, 2, 3, 4].map((l) => read(mid, String(l))), [false, false, true, true, false]);
  assertEquals(mid.weights.tokenEmbedding.data.length, 0);
  assertEquals(mid.weights.output.data.length, 0);
  const engine = await WasmEngine.create(mid.config, mid.weights, KV, {
    ...LIMITS,
    threads: 1,
    layers: { start: 2, end: 4 },
  });
  const full = await WasmEngine.create(whole.config, whole.weights, KV, { ...LIMITS, threads: 1 });
  assertEquals(engine.memory.kvCache, full.memory.kvCache * 2 / 5);
  assert(
    engine.memory.weights < full.memory.weights / 2,
    `${engine.memory.weights} of ${full.memory.weights}`,
  );
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
  await assertRejects(() => engine.step(plan), Error, "is a pipeline stage of layers 2-4 of 5");
  await assertRejects(
    () => engine.stepStage(plan),
    Error,
    "expected 128 f32 values, received none",
  );
  await assertRejects(
    () => engine.stepStage(plan, new Float32Array(5)),
    Error,
    "received 5 values",
  );
  const out = await engine.stepStage(plan, new Float32Array(128));
  assertEquals(out.kind === "rows" ? out.rows.length : -1, 128);
  engine.dispose();
  full.dispose();
});

Deno.test("splitEvenly makes at most n contiguous groups differing by at most one", () => {
  assertEquals(splitEvenly([1, 2, 3, 4, 5], 2), [[1, 2, 3], [4, 5]]);
  assertEquals(splitEvenly([1], 3), [[1]]);
  assertEquals(splitEvenly([], 2), [[]]);
});

Deno.test("pipeline stages that do not chain the model's layers are refused, naming the stage", async () => {
  const path = modelFile("stories260K.gguf");
  await assertRejects(
    () => loadModel(path, { placeTensors: stagePlacement({ start: 3, end: 9 }, path) }),
    Error,
    "Invalid layer range 3-9 for",
  );
  const m = await loadModel(path, { contextLength: 512 });
  const [a, b] = await stageEngines(path, [{ start: 0, end: 2 }, { start: 3, end: 5 }]);
  assertThrows(
    () => new PipelineEngine(m.config, KV, [a!, b!]),
    Error,
    "stage 1 runs layers 3-5, expected layers from 2 on",
  );
  assertThrows(
    () => new PipelineEngine(m.config, KV, [a!]),
    Error,
    "they run layers 0-2, the model has 5",
  );
  a!.dispose();
  b!.dispose();
});

Deno.test("through pipeline stages, a step's KV block copies reach every stage's layers and hidden states come from the last, as on one process", async () => {
  const path = modelFile("stories260K.gguf");
  const whole = await loadModel(path, { contextLength: 512 });
  const single = await WasmEngine.create(whole.config, whole.weights, KV, {
    ...LIMITS,
    threads: 1,
  });
  const ranges = [{ start: 0, end: 2 }, { start: 2, end: 5 }];
  const pp = new PipelineEngine(whole.config, KV, await stageEngines(path, ranges), LIMITS, 2);
  const seq = (seqId: number, tokens: number[], startPos: number, blockTable: number[]) => ({
    seqId,
    tokens,
    startPos,
    blockTable,
    sample: true,
    sampling: GREEDY,
    hidden: "all" as const,
  });
  const steps = async (e: Engine) => {
    // 20 tokens of seq 1 fill block 0 and 4 rows of block 1; seq 2 shares them through a copy of
    // block 1 into block 7 (copy-on-write of a partial block) and goes on from position 20.
    const a = await e.step({
      stepId: 0,
      returnLogits: true,
      seqs: [seq(1, Array.from({ length: 20 }, (_, i) => 10 + i), 0, [0, 1])],
    });
    const b = await e.step({
      stepId: 1,
      returnLogits: true,
      kvCopies: [[1, 7]],
      seqs: [seq(1, [99], 20, [0, 1]), seq(2, [123], 20, [0, 7])],
    });
    e.release?.(1);
    e.release?.(2);
    return [a, b].map((r) => ({
      sampled: r.sampled.map((s) => ({ token: s.token, logits: bits(s.logits!) })),
      hidden: r.hidden!.map((h) => ({ seqId: h.seqId, startPos: h.startPos, rows: bits(h.rows) })),
    }));
  };
  assertEquals(await steps(pp), await steps(single));
  pp.dispose();
  single.dispose();
});
