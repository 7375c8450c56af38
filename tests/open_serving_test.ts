import { assert, assertEquals } from "@std/assert";
import type { GenerationEvent, GenerationRequest } from "../lib/core/generation.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { FaultInjector, parseFaultSteps } from "../lib/engine/fault_injection.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { openServing, planServing } from "../lib/compose/open_serving.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { modelFile } from "./harness/model_files.ts";

const model = await loadModel(modelFile("stories260K.bin"), {
  tokenizerPath: modelFile("tok512.bin"),
});
const tokenizer = new Tokenizer(model.tokenizer!);
const KV = { numBlocks: 64, blockSize: 16 };
const LIMITS = { maxBatchTokens: 64, maxSeqs: 2 };

const PROMPT = tokenizer.encode("Once upon a time");

function request(extra: Partial<GenerationRequest> = {}): GenerationRequest {
  return {
    prompt: PROMPT,
    maxTokens: 12,
    sampling: GREEDY,
    stop: [],
    priority: "interactive",
    requestId: "open-serving",
    ...extra,
  };
}

async function run(events: AsyncIterable<GenerationEvent>) {
  const ids: number[] = [];
  let text = "";
  let end: GenerationEvent | undefined;
  for await (const e of events) {
    if (e.type === "token") {
      ids.push(...e.ids);
      text += e.text;
    } else end = e;
  }
  return { ids, text, end };
}

/** Greedy decoding straight on the reference engine, one token a step: the oracle. */
async function greedyAlone(prompt: readonly number[], n: number): Promise<number[]> {
  const engine = new CpuEngine(model.config, model.weights, KV);
  const blockTable = Array.from({ length: 4 }, (_, i) => i);
  const out: number[] = [];
  let tokens = [...prompt];
  let pos = 0;
  for (let i = 0; i < n; i++) {
    const r = await engine.step({
      stepId: i,
      seqs: [{ seqId: 1, tokens, startPos: pos, blockTable, sample: true, sampling: GREEDY }],
    });
    pos += tokens.length;
    const t = r.sampled[0]!.token;
    out.push(t);
    tokens = [t];
  }
  engine.dispose();
  return out;
}

Deno.test("openServing(): every engine, the first and each restart's, is wrapped; restarts and steps reach the metrics; the tokens are the engine's own", async () => {
  const faults = new FaultInjector(parseFaultSteps("3,7:device-lost"));
  const counted = { restarts: 0, steps: 0 };
  let ownSteps = 0;
  const { core, engine, description } = await openServing({
    model,
    tokenizer,
    backend: "reference",
    kv: KV,
    limits: LIMITS,
    warmUp: true,
    wrapEngine: (e) => faults.wrap(e),
    executor: { log: () => {}, onStep: (r) => void (r.error === undefined && ownSteps++) },
    metrics: {
      observeExecutorRestart: () => counted.restarts++,
      observeStep: () => counted.steps++,
      observeGrammarRestart: () => {
        throw new Error("no constrained request here: no grammar worker to restart");
      },
    },
  });
  try {
    assert(description.startsWith("reference"), description);
    assertEquals(engine.name, "cpu");
    const got = await run(core.generate(request()));
    assertEquals(got.end?.type, "done", JSON.stringify(got.end));
    assertEquals(got.ids, await greedyAlone(PROMPT, 12));
    // Step 7 lands on the first restart's engine: it was wrapped too.
    assertEquals(faults.injected, 2);
    assertEquals(core.executor.restarts, 2);
    assertEquals(counted.restarts, 2);
    // The metrics see the steps that computed; the caller's own hook still sees them too.
    assert(counted.steps >= 12, `${counted.steps} steps counted`);
    assertEquals(counted.steps, ownSteps);
  } finally {
    await core.close();
  }
});

Deno.test("openServing(): structured output is wired by default (the lazy grammar service) on the planned KV pool", async () => {
  const { core } = await openServing({
    model,
    tokenizer,
    backend: "reference",
    kv: KV,
    limits: LIMITS,
  });
  try {
    const got = await run(core.generate(request({
      maxTokens: 200,
      sampling: { ...GREEDY, temperature: 1, seed: 3 },
      constraint: {
        type: "json_schema",
        schema: JSON.stringify({
          type: "object",
          properties: { color: { enum: ["black", "white"] } },
          required: ["color"],
          additionalProperties: false,
        }),
      },
    })));
    assertEquals(got.end?.type, "done", JSON.stringify(got.end));
    const parsed = JSON.parse(got.text);
    assert(["black", "white"].includes(parsed.color) && Object.keys(parsed).length === 1, got.text);
    const s = core.schedulerStats();
    assertEquals(s.kvBlocksTotal, KV.numBlocks);
  } finally {
    await core.close();
  }
});

Deno.test("planServing(): the plan's geometry, and the model kept as it is when the cache holds its context", async () => {
  const whole = await planServing(model, { backend: "reference" }, {
    blockSize: 16,
    maxRunning: 2,
  });
  assertEquals(whole.kv, { numBlocks: whole.plan.numBlocks, blockSize: 16 });
  assertEquals(whole.plan.contextLength, 512);
  assertEquals(whole.model, model);
  // At least one full-context sequence per running slot (512 / 16 = 32 blocks each).
  assert(whole.plan.numBlocks >= 32, `${whole.plan.numBlocks} blocks`);
});
