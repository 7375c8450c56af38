/**
 * The compat files on the WebGPU engine (kernels reading every tensor type in its file
 * encoding): greedy tokens and logprobs against llama.cpp's fixtures, as
 * compat_llama_cpp_test.ts does for the CPU engine, and the WebGPU engine against the CPU
 * engine on prompts of random ids, which no fixture holds.
 *
 * Cost on llvmpipe (2 cores): a step of the six fixture prompts with their logits read back
 * takes 0.6-4 s on the 128k/152k vocabularies, so those compare steps 0-2 of each prompt (their
 * margins are all above 14 nats), TinyLlama's files steps 0-3, the stories260K carriers all 32.
 */
import { assert, assertEquals, assertLess, assertRejects } from "@std/assert";
import { WebGpuEngine } from "../kernels/webgpu/webgpu_engine.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { GREEDY, type SeqInput } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { compareGreedy, COMPAT_FILES, compatPath, readFixture } from "./harness/compat.ts";
import { relativeError, rng, testGpu } from "./_gpu.ts";
import { assertBatchInvariant } from "./_batch_invariance.ts";

const KV = { numBlocks: 6 * 6, blockSize: 16 };
const stepsFor = (stem: string) =>
  /^(llama3|qwen)/.test(stem) ? 3 : stem.startsWith("tinyllama") ? 4 : 32;

for (const stem of COMPAT_FILES) {
  Deno.test(`${stem} on webgpu: greedy tokens equal llama.cpp's where its margin > 0.5, logprobs within tolerance; random prompts equal the CPU engine's`, async () => {
    const [model, fx] = await Promise.all([loadModel(compatPath(stem)), readFixture(stem)]);
    const gpu = await WebGpuEngine.create(model.config, model.weights, KV, {
      gpu: await testGpu(),
      kvDtype: "f32",
      maxSeqs: 8,
    });
    try {
      const steps = stepsFor(stem);
      const results = await compareGreedy(gpu, fx.prompts, { steps });
      for (const r of results) {
        const where = `${stem} on webgpu, prompt '${r.name}'`;
        assert(r.firstMismatch === undefined, `${where}: ${JSON.stringify(r.firstMismatch)}`);
        assert(r.worstToTolerance <= 1, `${where}: max |Δlogprob| ${r.maxLogprobDelta}`);
      }
      if (!stem.startsWith("stories")) {
        assertEquals(results.reduce((n, r) => n + r.compared, 0), fx.prompts.length * steps);
      }

      // Two prompts of 24 random ids (any id: control tokens and byte pieces included), one
      // step together: the logits of both engines agree, the greedy ids are equal.
      const rand = rng(stem.length);
      const cpu = new CpuEngine(model.config, model.weights, KV);
      const seqs: SeqInput[] = [0, 1].map((i) => ({
        seqId: 50 + i,
        tokens: Array.from({ length: 24 }, () => Math.floor(rand() * model.config.vocabSize)),
        startPos: 0,
        blockTable: [20 + 2 * i, 21 + 2 * i],
        sample: true,
        sampling: GREEDY,
      }));
      const plan = { stepId: 0, seqs, returnLogits: true };
      const [g, c] = await Promise.all([gpu.step(plan), cpu.step(plan)]);
      g.sampled.forEach((s, i) => {
        const want = c.sampled[i]!;
        const err = relativeError(s.logits!, want.logits!);
        assertLess(err, 1e-3, `${stem}: random prompt ${i}: logits differ by ${err} (relative)`);
        assertEquals(s.token, want.token, `${stem}: random prompt ${i}: greedy id`);
      });
    } finally {
      gpu.dispose();
    }
  });
}

// llama.cpp's own KV cache is f16, so its fixtures hold for an f16 cache as well: the engine's
// default on devices with shader-f16. Steps 0-2 of each prompt (the 128k/152k vocabularies are
// slow on llvmpipe), all 32 on stories260K.
for (
  const stem of [
    "stories260K-q4_1",
    "tinyllama-like-q4_k_m",
    "qwen2-like-q4_k_m",
    "qwen3-like-q4_k_m",
  ] as const
) {
  Deno.test(`${stem} on webgpu with an f16 KV cache: greedy tokens equal llama.cpp's where its margin > 0.5, logprobs within tolerance (a device without shader-f16, as on OpenGL ES, refuses it by name)`, async () => {
    const [model, fx] = await Promise.all([loadModel(compatPath(stem)), readFixture(stem)]);
    const device = await testGpu();
    const create = () =>
      WebGpuEngine.create(model.config, model.weights, KV, {
        gpu: device,
        kvDtype: "f16",
        maxSeqs: 8,
      });
    if (!device.hasShaderF16) {
      await assertRejects(create, Error, "an f16 KV cache needs the device's shader-f16 feature");
      return;
    }
    const gpu = await create();
    try {
      assertEquals(gpu.kvDtype, "f16");
      const steps = stem.startsWith("stories") ? 32 : 3;
      const results = await compareGreedy(gpu, fx.prompts, { steps });
      for (const r of results) {
        const where = `${stem} on webgpu (f16 KV), prompt '${r.name}'`;
        assert(r.firstMismatch === undefined, `${where}: ${JSON.stringify(r.firstMismatch)}`);
        assert(r.worstToTolerance <= 1, `${where}: max |Δlogprob| ${r.maxLogprobDelta}`);
      }
      console.log(
        `${stem}, f16 KV: max |Δlogprob| against llama.cpp ${
          Math.max(...results.map((r) => r.maxLogprobDelta)).toFixed(4)
        } over ${results.reduce((n, r) => n + r.compared, 0)} steps`,
      );
    } finally {
      gpu.dispose();
    }
  });
}

Deno.test("WebGPU engine on qwen2-like (Q5_0/Q8_0/Q4_K/Q6_K, biases, unfused q/k/v): 16 prompts decoded together give each the logprobs it gets alone", async () => {
  const model = await loadModel(compatPath("qwen2-like-q4_k_m"));
  const gpu = await WebGpuEngine.create(model.config, model.weights, {
    numBlocks: 40,
    blockSize: 16,
  }, { gpu: await testGpu(), kvDtype: "f32", maxSeqs: 16 });
  try {
    await assertBatchInvariant(gpu, model.config.vocabSize, 2);
  } finally {
    gpu.dispose();
  }
});
