import { assert, assertEquals } from "@std/assert";
import type { SeqInput } from "../lib/engine/engine.ts";
import { type LogitControls, PenaltyState } from "../lib/core/logit_controls.ts";
import { SUPPRESS_BIAS } from "../lib/engine/logit_adjust.ts";
import { Harness } from "./_scheduler_harness.ts";

/** Every sampling entry of `seqId` in the harness's plans, in plan order. */
function entries(h: Harness, seqId: number): SeqInput[] {
  return h.plans.flatMap((p) => p.seqs.filter((s) => s.seqId === seqId && s.sample));
}

function rows(a: SeqInput["adjust"]): number[][] {
  return a === undefined
    ? []
    : [...a.ids].map((id, i) => [id, a.bias[i]!, a.penalty[i]!, a.subtract[i]!]);
}

const PENALTIES: LogitControls = {
  presencePenalty: 0.5,
  frequencyPenalty: 0.25,
  repetitionPenalty: 1.3,
};

Deno.test("Scheduler: a sequence with penalties is never decoded from a token still in flight, and each row's adjustment counts every token before it", () => {
  const h = new Harness({ vocabSize: 64, numBlocks: 32, blockSize: 4 });
  const prompt = [5, 6, 7, 5];
  const id = h.submit({ prompt, maxTokens: 12, controls: PENALTIES });
  const other = h.submit({ prompt: [9, 9, 9], maxTokens: 12 });
  h.runToEnd(3);
  const got = h.tokens(id);
  assertEquals(got.length, 12);
  const mine = entries(h, id);
  assert(
    mine.every((e) => !e.useLastSampled),
    "no decode of a penalized sequence feeds a token in flight",
  );
  assert(entries(h, other).some((e) => e.useLastSampled), "the other sequence still pipelines");
  // The entry that samples token i sees prompt + got[0..i): rebuilt here from the tokens alone.
  mine.forEach((e, i) => {
    const want = new PenaltyState(PENALTIES, [...prompt, ...got.slice(0, i)], prompt.length, []);
    assertEquals(rows(e.adjust), rows(want.adjust(prompt.length + i)), `token ${i}`);
  });
  assertEquals(
    rows(mine[0]!.adjust).map((r) => r[0]),
    [5, 6, 7],
    "the prompt's tokens, for the repetition penalty",
  );
});

Deno.test("Scheduler: logit bias alone keeps pipelining and rides on every sampling row", () => {
  const h = new Harness({ vocabSize: 64, numBlocks: 32, blockSize: 4 });
  const id = h.submit({
    prompt: [1, 2, 3],
    maxTokens: 10,
    controls: { logitBias: [[4, -100], [9, 2.5]] },
  });
  h.runToEnd(3);
  const mine = entries(h, id);
  assert(mine.some((e) => e.useLastSampled));
  for (const e of mine) assertEquals(rows(e.adjust), [[4, -100, 1, 0], [9, 2.5, 1, 0]]);
});

Deno.test("Scheduler: min_tokens suppresses the stop ids (EOS included) for exactly the first min_tokens rows", () => {
  const h = new Harness({ vocabSize: 64, numBlocks: 32, blockSize: 4 });
  const id = h.submit({
    prompt: [1, 2, 3],
    maxTokens: 8,
    stopTokenIds: [0, 7],
    controls: { minTokens: 3 },
  });
  h.runToEnd(3);
  const sup = [[0, Math.fround(SUPPRESS_BIAS), 1, 0], [7, Math.fround(SUPPRESS_BIAS), 1, 0]];
  entries(h, id).forEach((e, i) => assertEquals(rows(e.adjust), i < 3 ? sup : [], `row ${i}`));
});

Deno.test("Scheduler: the penalty state survives an engine failure: recomputed rows carry the adjustments an uninterrupted run has, and the same tokens", () => {
  const run = (fail: boolean) => {
    const h = new Harness({ vocabSize: 64, numBlocks: 32, blockSize: 4 });
    const prompt = [3, 1, 4, 1, 5];
    const id = h.submit({ prompt, maxTokens: 10, controls: PENALTIES });
    for (let i = 0; i < 6; i++) h.plan() && h.deliver();
    if (fail) h.failNext = true;
    h.runToEnd(2);
    return { h, id, prompt };
  };
  const clean = run(false), failed = run(true);
  assertEquals(failed.h.faults, 1);
  const tokens = failed.h.tokens(failed.id);
  assertEquals(tokens, clean.h.tokens(clean.id));
  // Every row that sampled token i after the restart still counts prompt + tokens[0..i).
  const mine = entries(failed.h, failed.id);
  const byPosition = new Map<number, SeqInput>();
  for (const e of mine) byPosition.set(e.startPos + (e.useLastSampled ? 1 : e.tokens.length), e);
  for (const [position, e] of byPosition) {
    const i = position - failed.prompt.length;
    const want = new PenaltyState(
      PENALTIES,
      [...failed.prompt, ...tokens.slice(0, i)],
      failed.prompt.length,
      [],
    );
    assertEquals(rows(e.adjust), rows(want.adjust(position)), `position ${position}`);
  }
});

Deno.test("Scheduler: `generated` prompt ids (a failover resubmission) count as output for the presence penalty", () => {
  const h = new Harness({ vocabSize: 64, numBlocks: 32, blockSize: 4 });
  const id = h.submit({
    prompt: [1, 2, 8, 8],
    maxTokens: 2,
    controls: { presencePenalty: 1 },
    generated: 2,
  });
  h.runToEnd(1);
  assertEquals(rows(entries(h, id)[0]!.adjust), [[8, 0, 1, 1]]);
});
