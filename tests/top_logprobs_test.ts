/**
 * Top alternatives with their logprobs: the host function against hand-computed values, the
 * WebGPU kernel against it on random rows (ties included), and the three engines alike on
 * stories260K with penalties and bias.
 */
import { assertAlmostEquals, assertEquals, assertThrows } from "@std/assert";
import { topLogprobs } from "../lib/engine/top_logprobs.ts";
import { TopLogprobsOp } from "../kernels/webgpu/top_logprobs.ts";
import { WebGpuEngine } from "../kernels/webgpu/webgpu_engine.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { type Engine, GREEDY, type SampledToken } from "../lib/engine/engine.ts";
import { PenaltyState } from "../lib/core/logit_controls.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { readU32, rng, runPass, storage, testGpu } from "./_gpu.ts";
import { modelFile } from "./harness/model_files.ts";
import { compatPath } from "./harness/compat.ts";

Deno.test("topLogprobs() lists the n largest logits, ties by the lower id, with hand-computed log softmax", () => {
  const logits = new Float32Array([1, 3, 3, 0, 2]);
  const lse = Math.log(Math.exp(1) + 2 * Math.exp(3) + 1 + Math.exp(2));
  const top = topLogprobs(logits, 4);
  assertEquals(top.ids, [1, 2, 4, 0]);
  [3, 3, 2, 1].forEach((v, i) => assertAlmostEquals(top.logprobs[i]!, v - lse, 1e-12));
  assertEquals(topLogprobs(logits, 0).ids, []);
  assertEquals(topLogprobs(new Float32Array([5, 4]), 20).ids, [0, 1], "at most the vocabulary");
  assertThrows(() => topLogprobs(logits, 21), Error, "n must be an integer in 0..20, received 21");
});

Deno.test("TopLogprobsOp on random rows (with ties) gives topLogprobs()'s ids, logprobs within 1e-5, only for the rows that ask", async () => {
  const gpu = await testGpu();
  const rand = rng(5);
  for (const vocab of [37, 512, 32000, 151936]) {
    const rows = 3;
    // Rounded to a coarse grid so that ties are common.
    const logits = Float32Array.from(
      { length: rows * vocab },
      () => Math.round((rand() * 2 - 1) * 40) / 4,
    );
    const buf = storage(gpu, logits);
    const op = new TopLogprobsOp(gpu, vocab, buf, rows);
    try {
      op.prepare([[20, 0, 5]]);
      assertEquals(op.use(0), 2);
      await runPass(gpu, (pass) => op.encode(pass));
      const words = await readU32(gpu, op.out, 2 * 20 * 2);
      const f32 = new Float32Array(words.buffer);
      [[0, 20], [2, 5]].forEach(([row, n], a) => {
        const want = topLogprobs(logits.subarray(row! * vocab, (row! + 1) * vocab), n!);
        const ids = Array.from({ length: n! }, (_, k) => words[2 * (a * 20 + k)]!);
        assertEquals(ids, want.ids, `vocab ${vocab} row ${row}`);
        want.logprobs.forEach((lp, k) => assertAlmostEquals(f32[2 * (a * 20 + k) + 1]!, lp, 1e-5));
      });
    } finally {
      op.destroy();
      buf.destroy();
    }
  }
});

const KV = { numBlocks: 64, blockSize: 16 };
const TABLE = Array.from({ length: 16 }, (_, i) => i);
const PROMPT = [1, 403, 407, 261, 378];

/** Greedy decode with penalties and bias, `top` (or 3 at even steps) alternatives asked. */
async function run(
  engine: Engine,
  steps: number,
  prompt = PROMPT,
  top = 20,
): Promise<SampledToken[]> {
  const controls = {
    repetitionPenalty: 1.4,
    presencePenalty: 0.5,
    logitBias: [[300, 2]] as [number, number][],
  };
  const state = new PenaltyState(controls, prompt, prompt.length, []);
  const all = [...prompt], out: SampledToken[] = [];
  let start = 0;
  for (let step = 0; step < steps; step++) {
    const adjust = state.adjust(all.length);
    const r = await engine.step({
      stepId: step,
      returnLogits: true,
      seqs: [
        {
          seqId: 1,
          tokens: all.slice(start),
          startPos: start,
          blockTable: TABLE,
          sample: true,
          sampling: GREEDY,
          adjust,
          topLogprobs: step % 2 ? top : 3,
        },
        // A row that asks for none shares every step: it gets none, and changes nothing.
        {
          seqId: 2,
          tokens: [prompt[step % prompt.length]!],
          startPos: step,
          blockTable: [20, 21],
          sample: true,
          sampling: GREEDY,
        },
      ],
    });
    const s = r.sampled[0]!;
    assertEquals(r.sampled[1]!.top, undefined);
    start = all.length;
    all.push(s.token);
    state.push(s.token);
    out.push(s);
  }
  engine.release?.(1);
  engine.release?.(2);
  return out;
}

Deno.test("reference, CPU and WebGPU engines list the same top alternatives with the same logprobs on stories260K, over the penalized and biased rows", async () => {
  const model = await loadModel(modelFile("stories260K.bin"), {
    tokenizerPath: modelFile("tok512.bin"),
  });
  const engines: [string, Engine, number][] = [
    ["cpu", await WasmEngine.create(model.config, model.weights, KV, { kvDtype: "f32" }), 2e-3],
    [
      "webgpu",
      await WebGpuEngine.create(model.config, model.weights, KV, {
        gpu: await testGpu(),
        kvDtype: "f32",
      }),
      1e-4,
    ],
  ];
  const reference = new CpuEngine(model.config, model.weights, KV);
  try {
    const want = await run(reference, 16);
    want.forEach((s, i) => {
      assertEquals(s.top!.ids.length, i % 2 ? 20 : 3);
      assertEquals(s.top!.ids[0], s.token, "greedy: the sampled token is the first alternative");
      assertAlmostEquals(s.top!.logprobs[0]!, s.logprob, 1e-9);
    });
    for (const [name, engine, tol] of engines) {
      const got = await run(engine, 16);
      got.forEach((s, i) => {
        assertEquals(s.token, want[i]!.token, `${name} step ${i}`);
        assertEquals(s.top!.ids, want[i]!.top!.ids, `${name} step ${i}: alternatives`);
        s.top!.logprobs.forEach((lp, k) =>
          assertAlmostEquals(lp, want[i]!.top!.logprobs[k]!, tol, `${name} step ${i} #${k}`)
        );
      });
    }
  } finally {
    reference.dispose();
    for (const [, e] of engines) e.dispose();
  }
});

Deno.test("reference, CPU and WebGPU engines list the same top 5 alternatives on a compat GGUF (tinyllama-like, 32000 tokens) under penalties and bias", async () => {
  const model = await loadModel(compatPath("tinyllama-like-q4_k_m"));
  const prompt = [1, 15043, 3186, 29892, 920];
  const reference = new CpuEngine(model.config, model.weights, KV);
  // The CPU engine quantizes activations to 8 bits for quantized weights, as llama.cpp does:
  // its alternatives' logprobs get the compat tests' tolerance (0.25 nats + 5% of the value).
  const engines: [string, Engine, (lp: number) => number][] = [
    [
      "cpu",
      await WasmEngine.create(model.config, model.weights, KV, { kvDtype: "f32" }),
      (lp) => 0.25 + 0.05 * Math.abs(lp),
    ],
    [
      "webgpu",
      await WebGpuEngine.create(model.config, model.weights, KV, {
        gpu: await testGpu(),
        kvDtype: "f32",
      }),
      () => 1e-4,
    ],
  ];
  try {
    const want = await run(reference, 6, prompt, 5);
    for (const [name, engine, tol] of engines) {
      const got = await run(engine, 6, prompt, 5);
      got.forEach((s, i) => {
        assertEquals(s.token, want[i]!.token, `${name} step ${i}`);
        const ref = want[i]!;
        if (name === "webgpu") {
          assertEquals(s.top!.ids, ref.top!.ids, `${name} step ${i}: alternatives`);
        }
        // The CPU engine's logits are not the reference's on quantized weights, so near-ties
        // may swap: each alternative it lists has the reference's logprob for that id, and the
        // k-th the reference's k-th, within the tolerance.
        const lse = logSumExp(ref.logits!);
        s.top!.ids.forEach((id, k) => {
          const lp = s.top!.logprobs[k]!;
          const byId = ref.logits![id]! - lse, kth = ref.top!.logprobs[k]!;
          assertAlmostEquals(lp, byId, tol(byId), `${name} step ${i} #${k}: id ${id}`);
          assertAlmostEquals(lp, kth, tol(kth), `${name} step ${i} #${k}: k-th value`);
        });
      });
    }
  } finally {
    reference.dispose();
    for (const [, e] of engines) e.dispose();
  }
});

function logSumExp(l: Float32Array): number {
  let max = -Infinity;
  for (const v of l) max = Math.max(max, v);
  let sum = 0;
  for (const v of l) sum += Math.exp(v - max);
  return max + Math.log(sum);
}
