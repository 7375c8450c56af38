import { assert, assertEquals } from "@std/assert";
import type { SamplingParams, SeqInput } from "../lib/engine/engine.ts";
import { logSoftmaxAt, sample } from "../lib/engine/sampling.ts";
import {
  allowedIds,
  allowsOnly,
  maskedArgmax,
  maskLogits,
  maskWords,
  tokenAllowed,
  tokenMaskProblem,
} from "../lib/engine/token_mask.ts";
import { sampleMaskedRow } from "../kernels/wasm/masked_sampling.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { parseLlama2cCheckpoint } from "../lib/model/llama2c_checkpoint.ts";
import { seededRandom } from "../lib/util/seeded_random.ts";
import { modelFile } from "./harness/model_files.ts";

function maskOf(vocab: number, ids: readonly number[]): Uint32Array {
  const m = new Uint32Array(maskWords(vocab));
  for (const id of ids) m[id >>> 5]! |= 1 << (id & 31);
  return m;
}

Deno.test("maskLogits(), maskedArgmax() and allowsOnly() on hand-made masks", () => {
  const logits = new Float32Array([5, 1, 3, 9, 3]);
  const m = maskOf(5, [1, 2, 4]);
  assertEquals([...maskLogits(logits, m)], [-Infinity, 1, 3, -Infinity, 3]);
  assertEquals(maskedArgmax(logits, m), 2); // 3 at ids 2 and 4: the lower id
  assertEquals(allowedIds(m, 5), [1, 2, 4]);
  assert(tokenAllowed(m, 4) && !tokenAllowed(m, 3));
  assert(allowsOnly(maskOf(40, [33]), [33], 40));
  assert(!allowsOnly(maskOf(40, [33, 34]), [33], 40));
  assertEquals(tokenMaskProblem(new Uint32Array(1), 5), "the token mask allows no token");
  assertEquals(
    tokenMaskProblem(new Uint32Array(3), 40),
    "a token mask over 40 ids has 2 words, received 3",
  );
});

Deno.test("a masked row samples the same token through sample() (reference) and sampleRow() (cpu), always an allowed one", () => {
  const random = seededRandom(99);
  const vocab = 700;
  const params: SamplingParams[] = [
    { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 },
    { temperature: 1, topK: 0, topP: 1, minP: 0, seed: 2 },
    { temperature: 0.7, topK: 40, topP: 1, minP: 0, seed: 3 },
    { temperature: 1.3, topK: 0, topP: 0.9, minP: 0, seed: 4 },
    { temperature: 1, topK: 0, topP: 1, minP: 0.05, seed: 5 },
    { temperature: 1, topK: 3, topP: 1, minP: 0, seed: 6 },
  ];
  for (let trial = 0; trial < 300; trial++) {
    const logits = new Float32Array(vocab).map(() => (random() - 0.5) * 12);
    const n = 1 + Math.floor(random() * 30);
    const ids = Array.from({ length: n }, () => Math.floor(random() * vocab));
    const mask = maskOf(vocab, ids);
    const p = params[trial % params.length]!;
    const position = trial;
    const ref = sample(maskLogits(logits, mask), p, position).token;
    const noStats = new Int32Array([0, 0, 0, 1]);
    const cpu = sampleMaskedRow(
      logits,
      p,
      position,
      mask,
      p.temperature === 0 || p.topK === 1,
      noStats,
      new Float32Array(4),
      0,
    );
    assertEquals(cpu.token, ref, `trial ${trial}`);
    assert(tokenAllowed(mask, ref), `trial ${trial}: token ${ref} is masked`);
    assertEquals(cpu.logprob, logSoftmaxAt(logits, ref)); // under the raw logits
  }
});

Deno.test("the reference and cpu engines sample only allowed tokens, and the same ones, in a batched step", async () => {
  const { config, weights } = parseLlama2cCheckpoint(
    await Deno.readFile(modelFile("stories260K.bin")),
    "stories260K.bin",
  );
  const kv = { numBlocks: 64, blockSize: 16 };
  const reference = new CpuEngine(config, weights, kv);
  const cpu = await WasmEngine.create(config, weights, kv, { maxSeqs: 8, kvDtype: "f32" });
  try {
    const random = seededRandom(5);
    const seqs: SeqInput[] = Array.from({ length: 6 }, (_, i) => ({
      seqId: i,
      tokens: [1, 403 + i, 407, 261],
      startPos: 0,
      blockTable: [i],
      sample: true,
      sampling: { temperature: i % 2 === 0 ? 0 : 1, topK: 0, topP: 1, minP: 0, seed: 77 + i },
      // A few allowed ids far apart in likelihood, so f32 rounding cannot flip the choice.
      tokenMask: maskOf(
        config.vocabSize,
        Array.from({ length: 3 }, () => Math.floor(random() * 512)),
      ),
    }));
    const plan = { stepId: 0, seqs };
    const [a, b] = await Promise.all([reference.step(plan), cpu.step(plan)]);
    for (let i = 0; i < seqs.length; i++) {
      assert(tokenAllowed(seqs[i]!.tokenMask!, a.sampled[i]!.token));
      assertEquals(b.sampled[i]!.token, a.sampled[i]!.token, `seq ${i}`);
    }
  } finally {
    cpu.dispose();
    reference.dispose();
  }
});
