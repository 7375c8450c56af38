/**
 * Token-level prefix reuse through the Scheduler on stories260K, on the reference, CPU (wasm)
 * and WebGPU engines: a prompt sharing all but its last token with a cached one prefills one
 * token, after a copy of the partly shared block, and its logits equal a cold run's bit for bit.
 */
import { assert, assertEquals, assertGreater } from "@std/assert";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { WebGpuEngine } from "../kernels/webgpu/webgpu_engine.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { type Engine, GREEDY, type StepPlan } from "../lib/engine/engine.ts";
import { Scheduler, schedulerConfig } from "../lib/core/scheduler.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { modelFile } from "./harness/model_files.ts";
import { fakeContinuation } from "./harness/fake_engine.ts";
import { Harness } from "./_scheduler_harness.ts";

const model = await loadModel(modelFile("stories260K.bin"), {
  tokenizerPath: modelFile("tok512.bin"),
});
const KV = { numBlocks: 32, blockSize: 16 };

interface Run {
  readonly plans: StepPlan[];
  /** Logits of every sampled row, by sequence. */
  readonly logits: Map<number, Float32Array[]>;
  readonly tokens: Map<number, number[]>;
}

/** Submits the prompts one after another, each run to its end, on one scheduler and engine. */
async function runEach(engine: Engine, prompts: number[][], maxTokens: number): Promise<Run> {
  const run: Run = { plans: [], logits: new Map(), tokens: new Map() };
  const sched = new Scheduler(
    schedulerConfig({
      ...engine.kv,
      contextLength: engine.config.contextLength,
      vocabSize: engine.config.vocabSize,
    }),
    (e) => {
      if (e.type === "token") run.tokens.get(e.seqId)!.push(e.token);
    },
  );
  for (const [i, prompt] of prompts.entries()) {
    const seqId = i + 1;
    run.tokens.set(seqId, []);
    run.logits.set(seqId, []);
    sched.submit({
      seqId,
      prompt,
      maxTokens,
      sampling: GREEDY,
      stopTokenIds: [],
      priority: "interactive",
    });
    for (let plan = sched.schedule(); plan; plan = sched.schedule()) {
      run.plans.push(plan);
      const result = await engine.step({ ...plan, returnLogits: true });
      for (const s of result.sampled) run.logits.get(s.seqId)!.push(s.logits!);
      sched.onResult(result);
    }
    assertEquals(run.tokens.get(seqId)!.length, maxTokens);
  }
  return run;
}

const first = Array.from({ length: 21 }, (_, i) => 1 + ((i * 37) % 500));
const second = [...first.slice(0, 20), 400];

for (
  const [name, make] of [
    ["reference", () => new CpuEngine(model.config, model.weights, KV)],
    ["cpu (wasm)", () => WasmEngine.create(model.config, model.weights, KV, { threads: 2 })],
    ["webgpu", () => WebGpuEngine.create(model.config, model.weights, KV)],
  ] as const
) {
  Deno.test(`Scheduler on ${name}: a prompt sharing 20 of 21 tokens prefills 1 and equals a cold run bit for bit`, async () => {
    const warm = await make(), cold = await make();
    try {
      const shared = await runEach(warm, [first, second], 4);
      const alone = await runEach(cold, [second], 4);
      const entry = shared.plans.flatMap((p) => p.seqs.map((s) => ({ p, s })))
        .find(({ s }) => s.seqId === 2)!;
      assertEquals(entry.s.startPos, 20, "its first step starts after the 20 shared tokens");
      assertEquals(entry.s.tokens, [400], "and prefills the one new token");
      assertEquals(entry.p.kvCopies?.length, 1, "after a copy of the partly shared block");
      const [src, dst] = entry.p.kvCopies![0]!;
      assertEquals(dst, entry.s.blockTable[1]);
      assert(src !== dst);
      assertEquals(shared.tokens.get(2), alone.tokens.get(1));
      const a = shared.logits.get(2)!, b = alone.logits.get(1)!;
      assertEquals(a.length, b.length);
      for (let i = 0; i < a.length; i++) {
        assertEquals(
          new Uint32Array(a[i]!.buffer),
          new Uint32Array(b[i]!.buffer),
          `step ${i}'s logits`,
        );
      }
    } finally {
      warm.dispose();
      cold.dispose();
    }
  });
}

Deno.test("Scheduler on the fake engine: sharers of partial blocks, preempted and recomputed in a small pool, get their solo tokens", () => {
  // 12 blocks of 4 for five sequences growing to 24 tokens each: they cannot all fit.
  const h = new Harness({ vocabSize: 512, numBlocks: 12, blockSize: 4 }, { watermarkBlocks: 0 });
  const base = Array.from({ length: 10 }, (_, i) => 7 + i);
  const first = { prompt: base, maxTokens: 14 };
  const ids = [h.submit(first)];
  h.plan(), h.plan(); // its blocks and its tail are in the cache from the next step on
  // Each shares 5..9 of base's tokens (a whole block and part of the next), then differs.
  const seqs = [5, 6, 7, 9].map((n, i) => ({
    prompt: [...base.slice(0, n), 300 + i],
    maxTokens: 18,
  }));
  for (const s of seqs) ids.push(h.submit(s));
  h.runToEnd(2);
  assertGreater(h.engine.blocksCopied, 0, "partial blocks were shared copy-on-write");
  assertGreater(h.sched.stats().preemptions, 0, "the pool is too small: someone was preempted");
  [first, ...seqs].forEach((s, i) =>
    assertEquals(
      h.tokens(ids[i]!),
      fakeContinuation(s.prompt, {
        maxTokens: s.maxTokens,
        contextLength: 48,
        vocabSize: 512,
        sampling: GREEDY,
      }),
    )
  );
  assertEquals(h.sched.stats().kvBlocksUsed, 0);
  h.sched.checkConsistency();
});
