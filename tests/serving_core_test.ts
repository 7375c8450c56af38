/**
 * The serving core on the real model (stories260K) with the CPU reference engine: every
 * generation, batched with others, chunked, sharing cached prefixes or preempted, gives exactly
 * the tokens the reference produces for it alone.
 */
import { assert, assertEquals, assertGreater } from "@std/assert";
import { ServingCore } from "../actors/core.ts";
import { GREEDY, type SamplingParams } from "../lib/engine/engine.ts";
import type { GenerationEvent } from "../lib/core/generation.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { referenceGenerate } from "../kernels/reference/reference_generate.ts";
import type { SchedulerConfig } from "../lib/core/scheduler.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { modelFile } from "./harness/model_files.ts";
import { closeCore } from "./_serving_core.ts";

const model = await loadModel(modelFile("stories260K.bin"), {
  tokenizerPath: modelFile("tok512.bin"),
});
const tokenizer = new Tokenizer(model.tokenizer!);

async function solo(
  prompt: number[],
  maxTokens: number,
  sampling: SamplingParams,
): Promise<number[]> {
  const engine = new CpuEngine(model.config, model.weights, { numBlocks: 64, blockSize: 16 });
  const { tokens } = await referenceGenerate(engine, prompt, maxTokens, sampling, {
    // The core's end ids: EOS, and BOS (a new story begins).
    stopTokens: [tokenizer.eosId, tokenizer.bosId],
  });
  const last = tokens.at(-1);
  return last === tokenizer.eosId || last === tokenizer.bosId ? tokens.slice(0, -1) : tokens;
}

function startCore(numBlocks: number, scheduler: Partial<SchedulerConfig> = {}): ServingCore {
  const make = () => new CpuEngine(model.config, model.weights, { numBlocks, blockSize: 16 });
  return new ServingCore({ engine: make(), engineFactory: make, codec: tokenizer, scheduler });
}

async function generate(
  core: ServingCore,
  prompt: string,
  maxTokens: number,
  sampling: SamplingParams = GREEDY,
) {
  const events: GenerationEvent[] = [];
  for await (
    const e of core.generate({
      prompt: tokenizer.encode(prompt),
      maxTokens,
      sampling,
      stop: [],
      priority: "interactive",
      requestId: "m",
    })
  ) {
    events.push(e);
  }
  const done = events.at(-1);
  if (done?.type !== "done") throw new Error(`generation ended with ${JSON.stringify(done)}`);
  return {
    ids: events.flatMap((e) => (e.type === "token" ? e.ids : [])),
    text: events.map((e) => (e.type === "token" ? e.text : "")).join(""),
    done,
  };
}

const PROMPTS = [
  "Once upon a time",
  "Lily and Tom went to the park",
  "The little dog was sad because",
  "One day, a big bird",
  "Once upon a time, there was a little girl named Lily. She loved to play outside",
  "Tim had a red ball",
  "The sun was hot and",
  "Once upon a time, there was a little girl named Lily. She had a cat",
];

Deno.test("ServingCore on stories260K: 8 concurrent generations, chunked and batched, equal their solo runs", async () => {
  const core = startCore(64, { maxBatchTokens: 24 });
  try {
    const samplings: SamplingParams[] = PROMPTS.map((_, i) =>
      i % 2 ? { ...GREEDY, temperature: 0.9, topP: 0.9, seed: 40 + i } : GREEDY
    );
    const got = await Promise.all(PROMPTS.map((p, i) => generate(core, p, 48, samplings[i]!)));
    for (let i = 0; i < PROMPTS.length; i++) {
      const want = await solo(tokenizer.encode(PROMPTS[i]!, { bos: true }), 48, samplings[i]!);
      assertEquals(got[i]!.ids, want, `prompt ${i}: ${JSON.stringify(PROMPTS[i])}`);
      assertEquals(
        got[i]!.text,
        tokenizer.decode(want),
        "streamed text = decoding the ids at once",
      );
    }
    assert(got[0]!.text.length > 20, got[0]!.text);
    assertGreater(
      core.schedulerStats().prefixHitTokens,
      0,
      "the two long 'Once upon a time, ...' prompts share blocks",
    );
  } finally {
    await closeCore(core);
  }
});

Deno.test("ServingCore on stories260K: a pool too small for all preempts, recomputes and changes no token", async () => {
  // 10 blocks of 16 = 160 slots for 4 sequences growing to ~100 tokens each.
  const core = startCore(10, { watermarkBlocks: 0 });
  try {
    const prompts = PROMPTS.slice(0, 4);
    const got = await Promise.all(prompts.map((p) => generate(core, p, 90)));
    assertGreater(core.schedulerStats().preemptions, 0);
    for (let i = 0; i < prompts.length; i++) {
      assertEquals(
        got[i]!.ids,
        await solo(tokenizer.encode(prompts[i]!, { bos: true }), 90, GREEDY),
        `prompt ${i}`,
      );
    }
  } finally {
    await closeCore(core);
  }
});
