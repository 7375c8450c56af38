import { assert, assertEquals, assertRejects, assertThrows } from "@std/assert";
import {
  type Engine,
  GREEDY,
  type SeqInput,
  type StepPlan,
  type StepResult,
} from "../lib/engine/engine.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { parseLlama2cCheckpoint } from "../lib/model/llama2c_checkpoint.ts";
import { planStep } from "../kernels/webgpu/step_plan.ts";
import { FakeEngine } from "./harness/fake_engine.ts";
import { modelFile } from "./harness/model_files.ts";

const model = parseLlama2cCheckpoint(
  await Deno.readFile(modelFile("stories260K.bin")),
  "stories260K.bin",
);
const KV = { numBlocks: 160, blockSize: 4 };
const CONTEXT = model.config.contextLength; // 512
const VOCAB = model.config.vocabSize; // 512

/** The GPU engine's planner without a device: it flattens a plan the way the kernels read it. */
class PlannerOnly implements Engine {
  readonly name = "webgpu planner";
  readonly config = model.config;
  readonly kv = KV;
  readonly #slots = new Map<number, number>();
  step(plan: StepPlan): Promise<StepResult> {
    try {
      const planned = planStep(plan, this.config, this.kv, {
        maxRows: 512,
        maxSeqs: 64,
        maxTableEntries: 64 * 128,
      }, (seqId, create) => {
        if (!this.#slots.has(seqId) && create) this.#slots.set(seqId, this.#slots.size);
        return this.#slots.get(seqId);
      });
      return Promise.resolve({
        stepId: plan.stepId,
        sampled: planned.sampledSeqIds.map((seqId) => ({ seqId, token: 0, logprob: 0 })),
      });
    } catch (e) {
      return Promise.reject(e);
    }
  }
  dispose(): void {}
}

/** The CPU engine is built asynchronously (its threads start); this defers to it. */
class Deferred implements Engine {
  readonly name = "cpu";
  readonly config = model.config;
  readonly kv = KV;
  readonly #engine = WasmEngine.create(model.config, model.weights, KV, { threads: 2 });
  async step(plan: StepPlan) {
    return await (await this.#engine).step(plan);
  }
  dispose(): void {
    this.#engine.then((e) => e.dispose());
  }
}

const engines: Record<string, () => Engine> = {
  reference: () => new CpuEngine(model.config, model.weights, KV),
  cpu: () => new Deferred(),
  fake: () => new FakeEngine({ vocabSize: VOCAB, contextLength: CONTEXT, ...KV }),
  "webgpu planner": () => new PlannerOnly(),
};

function seq(p: Partial<SeqInput>): SeqInput {
  return {
    seqId: 1,
    tokens: [1, 5],
    startPos: 0,
    blockTable: [0],
    sample: true,
    sampling: GREEDY,
    ...p,
  };
}

const fullTable = Array.from({ length: CONTEXT / KV.blockSize }, (_, i) => i);

/** Each bad plan and a fragment its error must contain (the plan runs on a fresh engine). */
const BAD: Array<[string, SeqInput[], string]> = [
  [
    "a position past the context",
    [seq({ startPos: CONTEXT - 1, blockTable: fullTable })],
    `reaches position ${CONTEXT}, past the context length ${CONTEXT}`,
  ],
  [
    "a block table too short",
    [seq({ tokens: [1, 2, 3, 4, 5], blockTable: [0] })],
    "needs 2 KV blocks for positions 0..4, its block table has 1",
  ],
  [
    "a block id outside the pool",
    [seq({ blockTable: [KV.numBlocks] })],
    `block id ${KV.numBlocks} at table entry 0, outside 0..${KV.numBlocks - 1}`,
  ],
  ["a fractional block id", [seq({ blockTable: [0.5] })], "block id 0.5"],
  [
    "a token id past the vocabulary",
    [seq({ tokens: [1, VOCAB] })],
    `token ${VOCAB} outside the vocabulary 0..${VOCAB - 1}`,
  ],
  ["a negative token id", [seq({ tokens: [-1] })], "token -1 outside the vocabulary"],
  ["no new tokens", [seq({ tokens: [] })], "has no new tokens"],
  [
    "a negative start position",
    [seq({ startPos: -1 })],
    "startPos -1, expected a non-negative integer",
  ],
  [
    "a top-p above 1",
    [seq({ sampling: { ...GREEDY, topP: 2 } })],
    "invalid sampling parameters (topP 2)",
  ],
  ["a NaN temperature", [seq({ sampling: { ...GREEDY, temperature: NaN } })], "temperature NaN"],
  ["a negative top-k", [seq({ sampling: { ...GREEDY, topK: -1 } })], "topK -1"],
  ["an infinite seed", [seq({ sampling: { ...GREEDY, seed: Infinity } })], "seed Infinity"],
  ["a sequence twice", [seq({}), seq({ blockTable: [1] })], "sequence 1 appears twice in one plan"],
  [
    "a last sampled token never sampled",
    [seq({ tokens: [], useLastSampled: true, startPos: 2 })],
    "last sampled none",
  ],
];

for (const [what, seqs, fragment] of BAD) {
  Deno.test(`every engine refuses a plan with ${what}, with the same message`, async () => {
    const messages: string[] = [];
    for (const [name, make] of Object.entries(engines)) {
      const engine = make();
      const err = await assertRejects(() => engine.step({ stepId: 7, seqs }), Error);
      assert(
        err.message.includes(fragment),
        `${name}: expected "${fragment}" in "${err.message}"`,
      );
      assert(err.message.startsWith("Cannot run step 7: sequence 1 "), `${name}: ${err.message}`);
      messages.push(err.message);
      engine.dispose();
    }
    assertEquals(new Set(messages).size, 1, `messages differ: ${messages.join(" | ")}`);
  });
}

for (
  const [what, kvCopies] of [
    ["a KV copy onto its own block", [[3, 3]]],
    ["a KV copy from outside the pool", [[KV.numBlocks, 2]]],
    ["a KV copy to a fractional block", [[1, 2.5]]],
    ["two KV copies to one block", [[1, 4], [2, 4]]],
  ] as const
) {
  Deno.test(`every engine refuses a plan with ${what}, with the same message`, async () => {
    const messages: string[] = [];
    for (const [name, make] of Object.entries(engines)) {
      const engine = make();
      const err = await assertRejects(
        () => engine.step({ stepId: 7, seqs: [seq({})], kvCopies }),
        Error,
      );
      assert(err.message.startsWith("Cannot run step 7: KV copy ["), `${name}: ${err.message}`);
      messages.push(err.message);
      engine.dispose();
    }
    assertEquals(new Set(messages).size, 1, `messages differ: ${messages.join(" | ")}`);
  });
}

Deno.test("the GPU planner refuses a step beyond the buffers it was sized for", () => {
  const plan: StepPlan = {
    stepId: 3,
    seqs: [seq({ tokens: [1, 2, 3, 4, 5, 6, 7, 8, 9], blockTable: [0, 1, 2] })],
  };
  assertThrows(
    () =>
      planStep(plan, model.config, KV, { maxRows: 8, maxSeqs: 4, maxTableEntries: 16 }, () => 0),
    Error,
    "Cannot run step 3: it has 9 token rows, 1 sequences and 3 block-table entries; the engine was sized for 8 rows",
  );
});

for (const name of ["reference", "cpu", "fake"]) {
  Deno.test(`${name} engine: a refused plan writes no KV, even for the sequences before the bad one`, async () => {
    const prompt = [1, 403, 407, 261];
    const decode = (engine: Engine) =>
      engine.step({ stepId: 2, seqs: [seq({ tokens: [300], startPos: 4, blockTable: [0, 1] })] });
    const untouched = engines[name]!();
    await untouched.step({ stepId: 0, seqs: [seq({ tokens: prompt })] });
    const expected = await decode(untouched);

    const engine = engines[name]!();
    await engine.step({ stepId: 0, seqs: [seq({ tokens: prompt })] });
    // Sequence 1 would overwrite its prompt's KV; sequence 2's sampling parameters are invalid.
    await assertRejects(
      () =>
        engine.step({
          stepId: 1,
          seqs: [
            seq({ tokens: [9, 9, 9, 9], sample: false }),
            seq({ seqId: 2, blockTable: [5], sampling: { ...GREEDY, minP: -1 } }),
          ],
        }),
      Error,
      "sequence 2 has invalid sampling parameters (minP -1)",
    );
    assertEquals(await decode(engine), expected);
    untouched.dispose();
    engine.dispose();
  });
}
