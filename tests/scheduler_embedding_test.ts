/**
 * Embeddings as the scheduler runs them: prefill-only sequences beside generations, on the fake
 * engine, whose hidden rows depend on every slot a row reads through its block table. The
 * oracle is the same prompt embedded alone in a fresh scheduler.
 */
import { assert, assertEquals, assertGreater } from "@std/assert";
import { Pooler, type Pooling } from "../lib/engine/pooling.ts";
import { fakeContinuation } from "./harness/fake_engine.ts";
import { Harness } from "./_scheduler_harness.ts";
import { GREEDY } from "../lib/engine/engine.ts";

const DIM = 8;

/** The pooled vector of a finished embedding, from its hidden events. */
function pooled(h: Harness, seqId: number, pooling: Pooling): Float32Array {
  const p = new Pooler(pooling, DIM);
  for (const e of h.events.get(seqId)!) if (e.type === "hidden") p.add(e.states);
  assertEquals(h.finished(seqId).reason, "stop");
  assertEquals(h.finished(seqId).completionTokens, 0);
  return p.result();
}

function alone(prompt: number[], pooling: Pooling): Float32Array {
  const h = new Harness({ vocabSize: 512, numBlocks: 64, blockSize: 4 });
  const id = h.submit({ prompt, maxTokens: 0, embed: pooling });
  h.runToEnd(2);
  return pooled(h, id, pooling);
}

const prompt = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i);

for (const pooling of ["mean", "cls", "last"] as const) {
  Deno.test(`Scheduler, ${pooling} pooling: embeddings beside generations in a small pool, preempted and cut into chunks, pool what they pool alone, and generations are unchanged`, () => {
    // 8 blocks of 4 and a 6-token budget: long prompts come in chunks, and the generations
    // (5 and 6 blocks at their end) cannot both fit, let alone beside embeddings.
    const h = new Harness(
      { vocabSize: 512, numBlocks: 8, blockSize: 4 },
      { watermarkBlocks: 0, maxBatchTokens: 6 },
    );
    const embeds = [prompt(13, 5), prompt(1, 40), prompt(9, 5), prompt(16, 100)];
    const gens = [{ prompt: prompt(6, 5), maxTokens: 14 }, {
      prompt: prompt(3, 70),
      maxTokens: 20,
    }];
    const genIds = gens.map((g) => h.submit(g));
    h.plan(), h.plan();
    const ids = embeds.map((p) => h.submit({ prompt: p, maxTokens: 0, embed: pooling }));
    h.runToEnd(2);
    assertGreater(h.sched.stats().preemptions, 0, "the pool is too small: someone was preempted");
    embeds.forEach((p, i) =>
      assertEquals([...pooled(h, ids[i]!, pooling)], [...alone(p, pooling)])
    );
    gens.forEach((g, i) =>
      assertEquals(
        h.tokens(genIds[i]!),
        fakeContinuation(g.prompt, {
          maxTokens: g.maxTokens,
          contextLength: h.engine.config.contextLength,
          vocabSize: 512,
          sampling: GREEDY,
        }),
      )
    );
    assertEquals(h.sched.stats().kvBlocksUsed, 0);
    h.sched.checkConsistency();
  });
}

Deno.test("Scheduler: an embedding takes nothing from the prefix cache and leaves nothing in it", () => {
  const h = new Harness({ vocabSize: 512, numBlocks: 32, blockSize: 4 });
  const p = prompt(12, 5);
  const gen = h.submit({ prompt: p, maxTokens: 2 });
  h.runToEnd(2);
  const before = h.engine.tokensComputed;
  const e = h.submit({ prompt: p, maxTokens: 0, embed: "mean" });
  h.runToEnd(2);
  // Every row computed, though a generation left these blocks cached.
  assertEquals(h.engine.tokensComputed - before, p.length);
  assert(h.events.get(e)!.some((ev) => ev.type === "scheduled" && ev.cachedTokens === 0));
  // A second generation of the same prompt finds only what the first generation cached.
  const hits = h.sched.stats().prefixHitTokens;
  const e2 = h.submit({ prompt: prompt(12, 200), maxTokens: 0, embed: "mean" });
  h.runToEnd(2);
  const g2 = h.submit({ prompt: prompt(12, 200), maxTokens: 1 });
  h.runToEnd(2);
  assertEquals(h.sched.stats().prefixHitTokens, hits, "the embedding's blocks were not cached");
  assertEquals(h.finished(e2).reason, "stop");
  assertEquals(h.tokens(gen).length, 2);
  assertEquals(h.tokens(g2).length, 1);
});
