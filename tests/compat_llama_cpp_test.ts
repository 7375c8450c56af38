/**
 * The compat files against llama.cpp's own outputs on them (compat/README.md): prompt ids for
 * every fixture prompt, and greedy decoding where llama.cpp's top-2 margin exceeds 0.5 nats
 * (stopping a prompt at its first smaller margin), with the logprobs of llama.cpp's top-2 ids
 * within logprobTolerance() at step 0 (always, which the near-tie stories260K carriers need:
 * step 0 depends on every tensor) and at every compared step.
 *
 * Cost on 2 cores: the reference engine dequantizes to f32 and runs the classifier in plain
 * TypeScript, 33-39 M multiply-adds a token for the 128k/152k vocabularies; those files
 * compare the first 12 steps of each prompt on the reference (their margins are all above 14
 * nats), the others all 32. The CPU engine (WebAssembly, 8-bit activations as llama.cpp's)
 * compares all 32 on every file.
 */
import { assert, assertEquals } from "@std/assert";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import type { Engine } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { ropeFrequencies } from "../lib/model/model_config.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { assertBatchInvariant } from "./_batch_invariance.ts";
import {
  compareGreedy,
  COMPAT_FILES,
  compatPath,
  type PromptComparison,
  readFixture,
} from "./harness/compat.ts";

/** Every compat file, with the steps the reference compares (fewer for the 128k+ vocabularies). */
const FILES: readonly { stem: string; cpuSteps: number }[] = COMPAT_FILES.map((stem) => ({
  stem,
  cpuSteps: /^(llama3|qwen)/.test(stem) ? 12 : 32,
}));

const KV = { numBlocks: 6 * 6, blockSize: 16 };

function assertAgrees(stem: string, engine: string, results: readonly PromptComparison[]) {
  for (const r of results) {
    const where = `${stem} on ${engine}, prompt '${r.name}'`;
    assert(
      r.firstMismatch === undefined,
      `${where}: greedy token differs from llama.cpp's at step ${r.firstMismatch?.step} (ours ${r.firstMismatch?.ours}, llama.cpp ${r.firstMismatch?.theirs}, its margin ${r.firstMismatch?.margin} nats)`,
    );
    assert(
      r.worstToTolerance <= 1,
      `${where}: a logprob is ${
        r.worstToTolerance.toFixed(2)
      }x its tolerance away from llama.cpp's (max |Δ| ${r.maxLogprobDelta.toFixed(3)} nats)`,
    );
  }
}

for (const { stem, cpuSteps } of FILES) {
  Deno.test(`${stem}: prompt ids equal llama.cpp's for every fixture prompt`, async () => {
    const [model, fx] = await Promise.all([loadModel(compatPath(stem)), readFixture(stem)]);
    const tok = new Tokenizer(model.tokenizer!);
    for (const p of fx.prompts) assertEquals(tok.encode(p.prompt), p.prompt_ids, p.name);
  });

  Deno.test(`${stem} on reference: greedy tokens equal llama.cpp's where its margin > 0.5, logprobs within tolerance`, async () => {
    const [model, fx] = await Promise.all([loadModel(compatPath(stem)), readFixture(stem)]);
    const engine: Engine = new CpuEngine(model.config, model.weights, KV);
    const results = await compareGreedy(engine, fx.prompts, { steps: cpuSteps });
    assertAgrees(stem, "reference", results);
    // The carriers' near-ties stop most prompts early; the peaked files compare every step.
    const compared = results.reduce((n, r) => n + r.compared, 0);
    if (!stem.startsWith("stories")) assertEquals(compared, fx.prompts.length * cpuSteps);
  });

  Deno.test(`${stem} on cpu: greedy tokens equal llama.cpp's where its margin > 0.5, logprobs within tolerance`, async () => {
    const [model, fx] = await Promise.all([loadModel(compatPath(stem)), readFixture(stem)]);
    const engine = await WasmEngine.create(model.config, model.weights, KV, {
      maxSeqs: fx.prompts.length,
    });
    try {
      const steps = 32;
      const results = await compareGreedy(engine, fx.prompts, { steps });
      assertAgrees(stem, "cpu", results);
      const compared = results.reduce((n, r) => n + r.compared, 0);
      if (!stem.startsWith("stories")) assertEquals(compared, fx.prompts.length * steps);
    } finally {
      engine.dispose();
    }
  });
}

Deno.test("llama3-like's rope_freqs.weight are Llama 3.1's factors (32, low 1, high 4, 8192) computed in float64, and the engines' frequencies divide by them", async () => {
  const model = await loadModel(compatPath("llama3-like-q4_k_m"));
  const c = model.config;
  assertEquals([c.ropeTheta, c.ropeDim], [500000, 64]);
  const [factor, low, high, orig] = [32, 1, 4, 8192];
  const freqs = ropeFrequencies(c);
  for (let i = 0; i < c.ropeDim / 2; i++) {
    const f = Math.pow(c.ropeTheta, -(2 * i) / c.ropeDim);
    const wavelen = (2 * Math.PI) / f;
    const smooth = (orig / wavelen - low) / (high - low);
    const scaled = wavelen < orig / high
      ? f
      : wavelen > orig / low
      ? f / factor
      : (1 - smooth) * (f / factor) + smooth * f;
    // Stored as f32 divisors f / scaled; the angle at position 100000 keeps 1e-6 of it.
    assert(Math.abs(c.ropeFreqFactors![i]! - Math.fround(f / scaled)) <= 1e-6 * (f / scaled));
    assert(Math.abs(freqs[i]! - scaled) <= 1e-7 * scaled, `pair ${i}`);
  }
});

Deno.test("reference engine on qwen2-like (Q5_0/Q8_0/Q4_K/Q6_K, biases): 16 prompts decoded together give each the logprobs it gets alone", async () => {
  const model = await loadModel(compatPath("qwen2-like-q4_k_m"));
  const engine = new CpuEngine(model.config, model.weights, { numBlocks: 40, blockSize: 16 });
  await assertBatchInvariant(engine, model.config.vocabSize, 2);
});
