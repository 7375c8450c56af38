/**
 * Logit bias and penalties on every engine: the WebGPU kernel against hand-computed values, and
 * the reference, CPU (WebAssembly) and WebGPU engines generating with penalties and bias from
 * the core's own PenaltyState, token for token alike.
 */
import { assert, assertAlmostEquals, assertEquals, assertNotEquals } from "@std/assert";
import { LogitAdjustOp } from "../kernels/webgpu/logit_adjust.ts";
import { WebGpuEngine } from "../kernels/webgpu/webgpu_engine.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { type Engine, GREEDY, type SamplingParams } from "../lib/engine/engine.ts";
import type { LogitAdjust } from "../lib/engine/logit_adjust.ts";
import { type LogitControls, PenaltyState } from "../lib/core/logit_controls.ts";
import { loadModel } from "../lib/model/load_model.ts";
import type { Model } from "../lib/model/weights.ts";
import { readF32, runPass, storage, testGpu } from "./_gpu.ts";
import { modelFile } from "./harness/model_files.ts";
import { compatPath } from "./harness/compat.ts";

const KV = { numBlocks: 64, blockSize: 16 };
const TABLE = Array.from({ length: 16 }, (_, i) => i);
const PROMPT = [1, 403, 407, 261, 378]; // "Once upon a time"

function adj(entries: [number, number, number, number][]): LogitAdjust {
  return {
    ids: Int32Array.from(entries.map((e) => e[0])),
    bias: Float32Array.from(entries.map((e) => e[1])),
    penalty: Float32Array.from(entries.map((e) => e[2])),
    subtract: Float32Array.from(entries.map((e) => e[3])),
  };
}

Deno.test("LogitAdjustOp applies bias, repetition and subtraction in place, per row, to hand-computed values", async () => {
  const gpu = await testGpu();
  const logits = storage(gpu, new Float32Array([2, -1, 0.5, 3, 1, 1, 1, 1]));
  const op = new LogitAdjustOp(gpu, 4, logits);
  try {
    // Two plans in one submit: the second one's region is the one used.
    op.prepare([
      [adj([[0, 7, 1, 0]])],
      [adj([[0, 0, 2, 0.75], [1, 0, 2, 0], [3, -100, 1, 0]]), adj([[2, 1, 3, 0.25]])],
    ]);
    op.use(1);
    await runPass(gpu, (pass) => op.encode(pass));
    // Row 0: 2/2 - 0.75, -1*2, untouched, 3 - 100; row 1: (1 + 1)/3 - 0.25 at token 2.
    const got = await readF32(gpu, logits, 8);
    assertEquals([...got.subarray(0, 4)], [0.25, -2, 0.5, -97]);
    assertAlmostEquals(got[6]!, 2 / 3 - 0.25, 1e-7);
    assertEquals([got[4], got[5], got[7]], [1, 1, 1]);
  } finally {
    op.destroy();
    logits.destroy();
  }
});

interface Generated {
  tokens: number[];
  logprobs: number[];
}

/**
 * Generates `n` tokens alone on `engine`, each row adjusted by the core's PenaltyState over the
 * tokens so far (the scheduler's rule for penalties: every decode feeds a known token).
 */
async function generate(
  engine: Engine,
  prompt: readonly number[],
  n: number,
  sampling: SamplingParams,
  controls: LogitControls | undefined,
): Promise<Generated> {
  const state = controls && new PenaltyState(controls, prompt, prompt.length, []);
  const all = [...prompt];
  const out: Generated = { tokens: [], logprobs: [] };
  let start = 0;
  for (let step = 0; step < n; step++) {
    const adjust = state?.adjust(all.length);
    const r = await engine.step({
      stepId: step,
      seqs: [{
        seqId: 1,
        tokens: all.slice(start),
        startPos: start,
        blockTable: TABLE,
        sample: true,
        sampling,
        ...(adjust ? { adjust } : {}),
      }],
    });
    const s = r.sampled[0]!;
    start = all.length;
    all.push(s.token);
    state?.push(s.token);
    out.tokens.push(s.token);
    out.logprobs.push(s.logprob);
  }
  engine.release?.(1);
  return out;
}

async function allEngines(model: Model): Promise<Record<"reference" | "cpu" | "webgpu", Engine>> {
  return {
    reference: new CpuEngine(model.config, model.weights, KV),
    // f32 KV: the CPU engine's logits are then within 1e-3 of the reference (wasm_engine_test).
    cpu: await WasmEngine.create(model.config, model.weights, KV, { kvDtype: "f32" }),
    webgpu: await WebGpuEngine.create(model.config, model.weights, KV, {
      gpu: await testGpu(),
      kvDtype: "f32",
    }),
  };
}

const SEEDED: SamplingParams = { temperature: 0.8, topK: 0, topP: 1, minP: 0, seed: 1234 };

async function checkEnginesAgree(
  model: Model,
  prompt: readonly number[],
  steps: number,
  cases: [string, LogitControls][],
  cpuTolerance = 2e-3,
): Promise<void> {
  const engines = await allEngines(model);
  try {
    for (const sampling of [GREEDY, SEEDED]) {
      const plain = await generate(engines.reference, prompt, steps, sampling, undefined);
      for (const [what, controls] of cases) {
        const want = await generate(engines.reference, prompt, steps, sampling, controls);
        const label = `${what}, temperature ${sampling.temperature}`;
        // The normaliser moves once any listed token's logit does: the controls took effect.
        assertNotEquals(
          want.logprobs,
          plain.logprobs,
          `${label}: the controls change the logprobs`,
        );
        for (const name of ["cpu", "webgpu"] as const) {
          const got = await generate(engines[name], prompt, steps, sampling, controls);
          assertEquals(got.tokens, want.tokens, `${label}: ${name} tokens`);
          const tol = name === "webgpu" ? 1e-4 : cpuTolerance;
          got.logprobs.forEach((lp, i) =>
            assertAlmostEquals(lp, want.logprobs[i]!, tol, `${label}: ${name} logprob ${i}`)
          );
        }
        for (const [id, bias] of controls.logitBias ?? []) {
          if (bias > -100) continue;
          assert(!want.tokens.includes(id), `${label}: banned ${id} was drawn`);
          if (plain.tokens.includes(id)) assertNotEquals(want.tokens, plain.tokens, label);
        }
      }
    }
  } finally {
    for (const e of Object.values(engines)) e.dispose();
  }
}

Deno.test("reference, CPU and WebGPU engines give the same tokens and logprobs on stories260K with repetition, presence and frequency penalties and logit bias", async () => {
  const model = await loadModel(modelFile("stories260K.bin"), {
    tokenizerPath: modelFile("tok512.bin"),
  });
  const ref = new CpuEngine(model.config, model.weights, KV);
  const greedy = await generate(ref, PROMPT, 40, GREEDY, undefined);
  ref.dispose();
  // Ban the greedy run's three most frequent tokens, and push one token up.
  const counts = new Map<number, number>();
  for (const t of greedy.tokens) counts.set(t, (counts.get(t) ?? 0) + 1);
  const top = [...counts].sort((a, b) => b[1] - a[1]).slice(0, 3).map(([t]) => t);
  await checkEnginesAgree(model, PROMPT, 40, [
    ["repetition_penalty 1.5", { repetitionPenalty: 1.5 }],
    ["repetition_penalty 1.3 over the last 8", { repetitionPenalty: 1.3, repeatLastN: 8 }],
    ["presence 1.5, frequency 0.7", { presencePenalty: 1.5, frequencyPenalty: 0.7 }],
    ["negative frequency -1", { frequencyPenalty: -1 }],
    ["logit_bias banning 3 tokens, +4 on one", {
      logitBias: [...new Map<number, number>([[300, 4], ...top.map((t) => [t, -100] as const)])]
        .sort((a, b) => a[0] - b[0]),
    }],
    ["everything", {
      logitBias: [[top[0]!, -100]],
      presencePenalty: 0.5,
      frequencyPenalty: 0.5,
      repetitionPenalty: 1.2,
    }],
  ]);
});

Deno.test("reference, CPU and WebGPU engines agree with penalties and bias on a compat GGUF (tinyllama-like, 32000-token SentencePiece vocabulary)", async () => {
  const model = await loadModel(compatPath("tinyllama-like-q4_k_m"));
  await checkEnginesAgree(model, [1, 15043, 3186, 29892, 920], 6, [
    ["repetition_penalty 2 and frequency 1", { repetitionPenalty: 2, frequencyPenalty: 1 }],
    ["logit_bias +30 on token 500", { logitBias: [[500, 30]] }],
    // The CPU engine quantizes activations to 8 bits for quantized weights, as llama.cpp does
    // (compat tests: its top-1 logprob is within 0.05 nats of llama.cpp's).
  ], 0.05);
});

Deno.test("each engine's logprob is over the biased row: log softmax of raw logits plus the bias, computed here from the raw logits", async () => {
  const model = await loadModel(modelFile("stories260K.bin"), {
    tokenizerPath: modelFile("tok512.bin"),
  });
  const engines = await allEngines(model);
  try {
    for (const [name, engine] of Object.entries(engines)) {
      const seq = {
        seqId: 1,
        tokens: PROMPT,
        startPos: 0,
        blockTable: TABLE,
        sample: true,
        sampling: GREEDY,
      };
      const raw = (await engine.step({ stepId: 0, seqs: [seq], returnLogits: true })).sampled[0]!;
      engine.release?.(1);
      // +3 on the raw runner-up: it wins if within 3 nats, and the normaliser moves either way.
      const runnerUp = [...raw.logits!.keys()].filter((i) => i !== raw.token)
        .reduce((a, b) => raw.logits![b]! > raw.logits![a]! ? b : a);
      const biased = (await engine.step({
        stepId: 1,
        seqs: [{ ...seq, adjust: adj([[runnerUp, 3, 1, 0]]) }],
      })).sampled[0]!;
      engine.release?.(1);
      const l = Array.from(raw.logits!, (v, i) => i === runnerUp ? v + 3 : v);
      const max = Math.max(...l);
      const lse = max + Math.log(l.reduce((s, v) => s + Math.exp(v - max), 0));
      const want = l.indexOf(max);
      assertEquals(biased.token, want, `${name}: token`);
      assertAlmostEquals(
        biased.logprob,
        l[want]! - lse,
        1e-4,
        `${name}: logprob over the biased row`,
      );
      assert(Math.abs(biased.logprob - raw.logprob) > 1e-3, `${name}: the bias moved the logprob`);
    }
  } finally {
    for (const e of Object.values(engines)) e.dispose();
  }
});

interface Spec {
  readonly prompt: readonly number[];
  readonly sampling: SamplingParams;
  readonly controls?: LogitControls;
}

/** Decodes several sequences in the same steps (each row adjusted by its own state). */
async function generateTogether(
  engine: Engine,
  specs: readonly Spec[],
  steps: number,
  seqBase: number,
): Promise<Generated[]> {
  const states = specs.map((s) =>
    s.controls && new PenaltyState(s.controls, s.prompt, s.prompt.length, [])
  );
  const all = specs.map((s) => [...s.prompt]);
  const starts = specs.map(() => 0);
  const out = specs.map((): Generated => ({ tokens: [], logprobs: [] }));
  for (let step = 0; step < steps; step++) {
    const r = await engine.step({
      stepId: step,
      seqs: specs.map((s, i) => {
        const adjust = states[i]?.adjust(all[i]!.length);
        return {
          seqId: seqBase + i,
          tokens: all[i]!.slice(starts[i]),
          startPos: starts[i]!,
          blockTable: [
            4 * (seqBase + i),
            4 * (seqBase + i) + 1,
            4 * (seqBase + i) + 2,
            4 * (seqBase + i) + 3,
          ],
          sample: true,
          sampling: s.sampling,
          ...(adjust ? { adjust } : {}),
        };
      }),
    });
    r.sampled.forEach((s, i) => {
      starts[i] = all[i]!.length;
      all[i]!.push(s.token);
      states[i]?.push(s.token);
      out[i]!.tokens.push(s.token);
      out[i]!.logprobs.push(s.logprob);
    });
  }
  specs.forEach((_, i) => engine.release?.(seqBase + i));
  return out;
}

Deno.test("batch invariance with penalties and bias: each sequence's tokens and logprobs are the same alone or sharing its steps (CPU and WebGPU engines)", async () => {
  const model = await loadModel(modelFile("stories260K.bin"), {
    tokenizerPath: modelFile("tok512.bin"),
  });
  const specs: Spec[] = [
    {
      prompt: PROMPT,
      sampling: SEEDED,
      controls: { repetitionPenalty: 1.3, frequencyPenalty: 0.5 },
    },
    { prompt: [1, 403, 407], sampling: GREEDY, controls: { logitBias: [[261, -100], [300, 3]] } },
    { prompt: [1, 300], sampling: { ...SEEDED, seed: 9 } },
    { prompt: PROMPT, sampling: GREEDY, controls: { presencePenalty: 1 } },
  ];
  const engines = await allEngines(model);
  try {
    for (const name of ["cpu", "webgpu"] as const) {
      const e = engines[name];
      const together = await generateTogether(e, specs, 20, 0);
      for (const [i, spec] of specs.entries()) {
        const [alone] = await generateTogether(e, [spec], 20, 8 + i);
        assertEquals(alone!.tokens, together[i]!.tokens, `${name} sequence ${i}: tokens`);
        assertEquals(
          alone!.logprobs,
          together[i]!.logprobs,
          `${name} sequence ${i}: logprobs, bit for bit`,
        );
      }
    }
  } finally {
    for (const e of Object.values(engines)) e.dispose();
  }
});
