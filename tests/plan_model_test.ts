/** The planner's view of a model: a GGUF's header read into layer bytes, or a named shape. */
import { assertEquals, assertRejects } from "@std/assert";
import { modelBytes, PLAN_SHAPES, planModel } from "../lib/cluster/plan_model.ts";
import { modelFile } from "./harness/model_files.ts";

Deno.test("a GGUF's shape and bytes come from its header (stories260K, F32)", async () => {
  const m = await planModel(modelFile("stories260K.gguf"));
  // Each layer: q, o 64×64; k, v 64×32; gate, up, down 64×172; two norms of 64; 4 bytes each.
  const layer = 4 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 172 + 2 * 64);
  assertEquals(m.layerBytes, Array(5).fill(layer));
  assertEquals([m.dim, m.hiddenDim, m.nHeads, m.nKvHeads, m.headDim], [64, 172, 8, 4, 8]);
  assertEquals([m.vocabSize, m.embeddingBytes, m.classifierBytes], [
    512,
    4 * 512 * 64,
    4 * 512 * 64,
  ]);
  assertEquals(m.tiedClassifier, false);
});

Deno.test("the named shapes: the perf files' bytes, and a 40 GB Q4 70B", async () => {
  const gib = (b: number) => Math.round(b / 2 ** 30 * 10) / 10;
  assertEquals((await planModel("llama32_1b")).layerBytes.length, 16);
  // The 1B file is 807,694,560 bytes: its header, output norm and rope factors are the rest.
  assertEquals(modelBytes(PLAN_SHAPES.llama32_1b!), 584_384_512 + 215_470_080);
  assertEquals(gib(modelBytes(PLAN_SHAPES.llama31_70b!)), 39.6);
  await assertRejects(
    () => planModel("llama-9000"),
    Error,
    'Cannot plan for model "llama-9000": it is neither a shape (qwen25_05b, llama32_1b, llama31_8b, llama31_70b) nor a readable GGUF file',
  );
});
