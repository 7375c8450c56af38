/** Test helper: 16 prompts alone against the same 16 in one batch, on any engine. */
import { assertEquals } from "@std/assert";
import { type Engine, GREEDY, type SeqInput } from "../lib/engine/engine.ts";
import { rng } from "./_gpu.ts";

/**
 * 16 prompts of 2..16 random ids (seeded), prefilled in one step and decoded `steps` tokens
 * together, against each prompt run alone (other KV blocks, another sequence id): the sampled
 * ids and their logprobs must be the same bits.
 */
export async function assertBatchInvariant(engine: Engine, vocab: number, steps: number) {
  const rand = rng(11);
  const prompts = Array.from(
    { length: 16 },
    () => Array.from({ length: 2 + Math.floor(rand() * 15) }, () => Math.floor(rand() * vocab)),
  );
  const run = async (ids: number[][], seqBase: number, blockBase: number) => {
    const out = ids.map(() => [] as [number, number][]);
    const pos = ids.map(() => 0);
    let next = ids.map((p) => p);
    for (let step = 0; step < steps; step++) {
      const seqs: SeqInput[] = ids.map((_, i) => ({
        seqId: seqBase + i,
        tokens: next[i]!,
        startPos: pos[i]!,
        blockTable: [blockBase + 2 * i, blockBase + 2 * i + 1],
        sample: true,
        sampling: GREEDY,
      }));
      const r = await engine.step({ stepId: step, seqs });
      r.sampled.forEach((s, i) => {
        out[i]!.push([s.token, s.logprob]);
        pos[i]! += next[i]!.length;
      });
      next = r.sampled.map((s) => [s.token]);
    }
    ids.forEach((_, i) => engine.release?.(seqBase + i));
    return out;
  };
  const together = await run(prompts, 0, 0);
  for (let i = 0; i < prompts.length; i++) {
    const [alone] = await run([prompts[i]!], 100 + i, 34);
    assertEquals(together[i], alone, `prompt ${i}: together vs alone`);
  }
}
