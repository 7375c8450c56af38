import { assert, assertEquals, assertRejects } from "@std/assert";
import {
  type Engine,
  GREEDY,
  type SamplingParams,
  type SeqInput,
  type StepPlan,
} from "../lib/engine/engine.ts";
import { parseLlama2cCheckpoint } from "../lib/model/llama2c_checkpoint.ts";
import type { ModelConfig } from "../lib/model/model_config.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { referenceGenerate } from "../kernels/reference/reference_generate.ts";
import { sample } from "../lib/engine/sampling.ts";
import type { ModelWeights } from "../lib/model/weights.ts";
import { modelFile } from "./harness/model_files.ts";

const FIXTURES = new URL("./fixtures/run_c/", import.meta.url);
const { config, weights } = parseLlama2cCheckpoint(
  await Deno.readFile(modelFile("stories260K.bin")),
  "stories260K.bin",
);
const KV = { numBlocks: 96, blockSize: 4 };
const SEEDED: SamplingParams = { temperature: 0.9, topK: 40, topP: 0.95, minP: 0.02, seed: 2024 };

/** A fixture's prompt (BOS first) and the tokens run.c generated after it. */
function runC(name: string): { prompt: number[]; generated: number[] } {
  const text = Deno.readTextFileSync(new URL(`${name}.ids.txt`, FIXTURES));
  const [prompt, generated] = ["prompt", "generated"].map((key) => {
    const line = text.split("\n").find((l) => l.startsWith(`${key} `));
    if (!line) throw new Error(`fixture ${name}.ids.txt has no '${key}' line`);
    return line.split(" ").slice(1).map(Number);
  });
  return { prompt: prompt!, generated: generated! };
}

function seq(
  p: Partial<SeqInput> & Pick<SeqInput, "tokens" | "startPos" | "blockTable">,
): SeqInput {
  return { seqId: 0, sample: true, sampling: GREEDY, ...p };
}

async function logitsOf(engine: CpuEngine, plan: StepPlan): Promise<Float32Array[]> {
  const r = await engine.step({ ...plan, returnLogits: true });
  return r.sampled.map((s) => s.logits!);
}

const range = (n: number, from = 0) => Array.from({ length: n }, (_, i) => from + i);

/** max |a - b| / max |b|: logits differ in rounding only, so this stays near f32 epsilon. */
function relError(a: Float32Array, b: ArrayLike<number>): number {
  let diff = 0;
  let mag = 0;
  for (let i = 0; i < b.length; i++) {
    diff = Math.max(diff, Math.abs(a[i]! - b[i]!));
    mag = Math.max(mag, Math.abs(b[i]!));
  }
  return diff / mag;
}

for (
  const name of [
    "once_upon_a_time_n64",
    "once_upon_a_time_n256",
    "no_prompt_n128",
    "lily_and_tom_n200",
    "utf8_n48",
  ]
) {
  Deno.test(`CpuEngine greedy tokens equal llama2.c run.c for the whole run: ${name}`, async () => {
    const { prompt, generated } = runC(name);
    const engine = new CpuEngine(config, weights, KV);
    const { tokens } = await referenceGenerate(engine, prompt, generated.length, GREEDY);
    assertEquals(tokens, generated);
  });
}

Deno.test("CpuEngine logits equal run.c's at the positions it printed, within 1e-5 of the largest", async () => {
  for (const name of ["once_upon_a_time_n64", "no_prompt_n128"]) {
    const { prompt, generated } = runC(name);
    const ids = [...prompt, ...generated];
    const rows = Deno.readTextFileSync(new URL(`${name}.logits.txt`, FIXTURES)).trim().split("\n")
      .map((l) => l.split(" ").map(Number));
    const engine = new CpuEngine(config, weights, KV);
    let done = 0;
    for (const [pos, ...want] of rows) {
      // Feed up to and including position pos; the last row's logits are run.c's at pos.
      const [got] = await logitsOf(engine, {
        stepId: pos!,
        seqs: [
          seq({
            tokens: ids.slice(done, pos! + 1),
            startPos: done,
            blockTable: range(KV.numBlocks),
          }),
        ],
      });
      done = pos! + 1;
      assertEquals(got!.length, config.vocabSize);
      const err = relError(got!, want);
      assert(err < 1e-5, `${name} position ${pos}: relative error ${err}`);
    }
  }
});

Deno.test("CpuEngine reads and writes only the blocks a scrambled block table names", async () => {
  const { prompt, generated } = runC("lily_and_tom_n200");
  const ids = [...prompt, ...generated].slice(0, 38); // 10 blocks of 4
  const other = runC("once_upon_a_time_n256");
  const otherIds = [...other.prompt, ...other.generated].slice(0, 64 * 4);
  const plain = new CpuEngine(config, weights, KV);
  const [want] = await logitsOf(plain, {
    stepId: 0,
    seqs: [seq({ tokens: ids, startPos: 0, blockTable: range(10) })],
  });
  // The other sequence alone: a prefill over blocks 0..63, then one more token.
  const otherTable = [...range(64), 95];
  const alone = new CpuEngine(config, weights, KV);
  await alone.step({
    stepId: 0,
    seqs: [seq({ seqId: 9, tokens: otherIds, startPos: 0, blockTable: otherTable, sample: false })],
  });
  const next = seq({ seqId: 9, tokens: [432], startPos: otherIds.length, blockTable: otherTable });
  const [wantOther] = await logitsOf(alone, { stepId: 1, seqs: [next] });

  const scrambled = new CpuEngine(config, weights, KV);
  await scrambled.step({
    stepId: 0,
    seqs: [seq({ seqId: 9, tokens: otherIds, startPos: 0, blockTable: otherTable, sample: false })],
  });
  // Blocks 64..94, in no order; they held nothing, so a read through a wrong slot sees zeros or
  // the other sequence, and a write through a wrong slot corrupts the other sequence.
  const table = [90, 71, 88, 64, 79, 94, 66, 83, 70, 77];
  const [got] = await logitsOf(scrambled, {
    stepId: 1,
    seqs: [seq({ tokens: ids, startPos: 0, blockTable: table })],
  });
  assertEquals(got, want);
  const [gotOther] = await logitsOf(scrambled, { stepId: 2, seqs: [next] });
  assertEquals(gotOther, wantOther);
});

Deno.test("CpuEngine prefill chunked into 1, 7 and the rest gives the one-prefill next-token logits", async () => {
  const { prompt, generated } = runC("once_upon_a_time_n256");
  const ids = [...prompt, ...generated].slice(0, 45);
  const table = range(12);
  const whole = await logitsOf(new CpuEngine(config, weights, KV), {
    stepId: 0,
    seqs: [seq({ tokens: ids, startPos: 0, blockTable: table })],
  });
  const chunked = new CpuEngine(config, weights, KV);
  let pos = 0;
  const chunks = [1, 7, ids.length - 8];
  let last: Float32Array[] = [];
  for (const [i, n] of chunks.entries()) {
    const final = i === chunks.length - 1;
    const plan: StepPlan = {
      stepId: i,
      seqs: [
        seq({ tokens: ids.slice(pos, pos + n), startPos: pos, blockTable: table, sample: final }),
      ],
    };
    const r = await chunked.step({ ...plan, returnLogits: true });
    assertEquals(r.sampled.length, final ? 1 : 0, "a non-final chunk samples nothing");
    last = r.sampled.map((s) => s.logits!);
    pos += n;
  }
  assertEquals(last, whole);
});

Deno.test("CpuEngine runs two sequences in one step exactly as each alone", async () => {
  const a = runC("once_upon_a_time_n256");
  const b = runC("lily_and_tom_n200");
  const aIds = [...a.prompt, ...a.generated].slice(0, 21);
  const bIds = [...b.prompt, ...b.generated].slice(0, 13);
  const aTable = range(6);
  const bTable = range(4, 40);

  const alone = async (ids: number[], table: number[], sampling: SamplingParams) => {
    const e = new CpuEngine(config, weights, KV);
    // a 20-token prefill, then one decode of the 21st token (b: 12 then 1)
    await e.step({
      stepId: 0,
      seqs: [seq({ tokens: ids.slice(0, -1), startPos: 0, blockTable: table, sample: false })],
    });
    const r = await e.step({
      stepId: 1,
      returnLogits: true,
      seqs: [seq({ tokens: ids.slice(-1), startPos: ids.length - 1, blockTable: table, sampling })],
    });
    return r.sampled[0]!;
  };
  const wantA = await alone(aIds, aTable, GREEDY);
  const wantB = await alone(bIds, bTable, SEEDED);

  const e = new CpuEngine(config, weights, KV);
  // Step 0: both prefill; step 1: a decodes while b decodes, listed in the other order.
  await e.step({
    stepId: 0,
    seqs: [
      seq({ seqId: 1, tokens: aIds.slice(0, -1), startPos: 0, blockTable: aTable, sample: false }),
      seq({ seqId: 2, tokens: bIds.slice(0, -1), startPos: 0, blockTable: bTable, sample: false }),
    ],
  });
  const r = await e.step({
    stepId: 1,
    returnLogits: true,
    seqs: [
      seq({
        seqId: 2,
        tokens: bIds.slice(-1),
        startPos: bIds.length - 1,
        blockTable: bTable,
        sampling: SEEDED,
      }),
      seq({ seqId: 1, tokens: aIds.slice(-1), startPos: aIds.length - 1, blockTable: aTable }),
    ],
  });
  assertEquals(r.sampled.map((s) => s.seqId), [2, 1]);
  assertEquals(r.sampled[0]!.logits, wantB.logits);
  assertEquals(r.sampled[0]!.token, wantB.token);
  assertEquals(r.sampled[1]!.logits, wantA.logits);
  assertEquals(r.sampled[1]!.token, wantA.token);
});

Deno.test("CpuEngine samples at position startPos + new tokens and reports the raw logprob", async () => {
  const { prompt } = runC("once_upon_a_time_n64");
  const e = new CpuEngine(config, weights, KV);
  // A hot, unfiltered distribution: the draw, hence the position it used, decides the token.
  const hot = (seed: number): SamplingParams => ({
    temperature: 3,
    topK: 0,
    topP: 1,
    minP: 0,
    seed,
  });
  const r = await e.step({
    stepId: 0,
    returnLogits: true,
    seqs: range(8).map((i) =>
      seq({
        seqId: i,
        tokens: prompt,
        startPos: 0,
        blockTable: [2 * i, 2 * i + 1],
        sampling: hot(i),
      })
    ),
  });
  for (const s of r.sampled) {
    assertEquals(
      { token: s.token, logprob: s.logprob },
      sample(s.logits!, hot(s.seqId), prompt.length),
    );
  }
  assert(
    new Set(r.sampled.map((s) => s.token)).size > 4,
    "different seeds should draw different tokens",
  );
});

Deno.test("CpuEngine useLastSampled decodes from the token it sampled, even when steps are not awaited", async () => {
  const { prompt } = runC("once_upon_a_time_n64");
  const literal = await referenceGenerate(new CpuEngine(config, weights, KV), prompt, 12, SEEDED);
  const e = new CpuEngine(config, weights, KV);
  const table = range(5);
  // Submit all steps at once: each must see the token of the one before.
  const steps = range(12).map((i) =>
    e.step({
      stepId: i,
      seqs: [seq({
        tokens: i === 0 ? prompt : [],
        useLastSampled: i > 0,
        startPos: i === 0 ? 0 : prompt.length + i - 1,
        blockTable: table,
        sampling: SEEDED,
      })],
    })
  );
  const results = await Promise.all(steps);
  assertEquals(results.map((r) => r.sampled[0]!.token), literal.tokens);
  assertEquals(results.map((r) => r.stepId), range(12));
});

Deno.test("CpuEngine release() forgets the last sampled token, also when its step has not run yet", async () => {
  const { prompt } = runC("once_upon_a_time_n64");
  const e: Engine = new CpuEngine(config, weights, KV);
  const prefill = (seqId: number, stepId: number) =>
    e.step({ stepId, seqs: [seq({ seqId, tokens: prompt, startPos: 0, blockTable: range(5) })] });
  const decode = (seqId: number, stepId: number) =>
    e.step({
      stepId,
      seqs: [
        seq({
          seqId,
          tokens: [],
          useLastSampled: true,
          startPos: prompt.length,
          blockTable: range(5),
        }),
      ],
    });
  // The executor releases a sequence as soon as the scheduler says so, while earlier steps
  // that sample for it may still be queued in the engine.
  const first = prefill(1, 0);
  e.release!(1);
  await first;
  await assertRejects(() => decode(1, 1), Error, "last sampled none");
  await prefill(2, 2);
  e.release!(2);
  await assertRejects(() => decode(2, 3), Error, "last sampled none");
});

Deno.test("CpuEngine rejects a bad plan, naming the problem, and leaves its cache untouched", async () => {
  const { prompt } = runC("once_upon_a_time_n64");
  const e = new CpuEngine(config, weights, KV);
  const before = await logitsOf(e, {
    stepId: 0,
    seqs: [seq({ tokens: prompt, startPos: 0, blockTable: [0, 1] })],
  });
  const bad = (s: Partial<SeqInput>) =>
    e.step({ stepId: 7, seqs: [seq({ tokens: [5], startPos: 5, blockTable: [0, 1], ...s })] });
  await assertRejects(
    () => bad({ tokens: [600] }),
    Error,
    "sequence 0 has token 600 outside the vocabulary 0..511",
  );
  await assertRejects(
    () => bad({ blockTable: [0] }),
    Error,
    "needs 2 KV blocks for positions 0..5, its block table has 1",
  );
  await assertRejects(
    () => bad({ blockTable: [0, 96] }),
    Error,
    "block id 96 at table entry 1, outside 0..95",
  );
  await assertRejects(
    () => bad({ seqId: 3, tokens: [], useLastSampled: true }),
    Error,
    "last sampled none",
  );
  await assertRejects(() => bad({ tokens: [] }), Error, "has no new tokens");
  // A valid first sequence followed by an invalid one: nothing of the step may run.
  await assertRejects(
    () =>
      e.step({
        stepId: 8,
        seqs: [
          seq({ seqId: 0, tokens: [17, 17, 17], startPos: 0, blockTable: [0, 1] }),
          seq({ seqId: 0, tokens: [5], startPos: 0, blockTable: [2] }),
        ],
      }),
    Error,
    "sequence 0 appears twice in one plan",
  );
  const after = await logitsOf(e, {
    stepId: 9,
    seqs: [seq({ tokens: [prompt.at(-1)!], startPos: prompt.length - 1, blockTable: [0, 1] })],
  });
  assertEquals(after, before);
});

Deno.test("CpuEngine reads an untied classifier from its own tensor", async () => {
  // Same weights, classifier scaled by 2 and stored apart: logits are linear in it, so they double.
  const doubled = new Float32Array(weights.output.data.slice().buffer).map((v) => 2 * v);
  const untied: ModelWeights = {
    ...weights,
    output: { ...weights.output, name: "output", data: new Uint8Array(doubled.buffer) },
  };
  const plan: StepPlan = {
    stepId: 0,
    seqs: [seq({ tokens: [1, 403, 407], startPos: 0, blockTable: [0] })],
  };
  const [tied] = await logitsOf(new CpuEngine(config, weights, KV), plan);
  const [got] = await logitsOf(new CpuEngine(config, untied, KV), plan);
  assertEquals(got, tied!.map((v) => 2 * v));
});

Deno.test("CpuEngine refuses weights whose shapes disagree with the config", () => {
  const wrong: ModelConfig = { ...config, hiddenDim: 100 };
  let message = "";
  try {
    new CpuEngine(wrong, weights, KV);
  } catch (e) {
    message = (e as Error).message;
  }
  assertEquals(
    message,
    "Cannot prepare CPU weights: tensor 'layers.0.w1' has shape [172, 64], expected [100, 64]",
  );
});
