import { assertEquals, assertThrows } from "@std/assert";
import { Scheduler, schedulerConfig } from "../lib/core/scheduler.ts";
import type { SeqEvent } from "../lib/core/seq_events.ts";
import { GREEDY } from "../lib/engine/engine.ts";

const POOL = { numBlocks: 16, blockSize: 4, contextLength: 64 };

Deno.test("a scheduler without a vocabulary size is refused, naming what it received", () => {
  // A size of 0 used to turn the vocabulary checks off: every token id passed.
  for (const vocabSize of [0, -1, 1.5, NaN]) {
    assertThrows(
      () => schedulerConfig({ ...POOL, vocabSize }),
      RangeError,
      `Cannot create scheduler: vocabSize must be a positive integer, received ${vocabSize}`,
    );
  }
});

Deno.test("a scheduler checks prompt ids against the vocabulary size it was given", () => {
  const events: SeqEvent[] = [];
  const sched = new Scheduler(schedulerConfig({ ...POOL, vocabSize: 100 }), (e) => events.push(e));
  const submit = (seqId: number, prompt: number[]) =>
    sched.submit({
      seqId,
      prompt,
      maxTokens: 2,
      stopTokenIds: [],
      sampling: GREEDY,
      priority: "interactive",
    });
  submit(1, [1, 99]);
  submit(2, [1, 100]);
  assertEquals(events.map((e) => [e.seqId, e.type]), [[1, "accepted"], [2, "rejected"]]);
  const refusal = events[1] as Extract<SeqEvent, { type: "rejected" }>;
  assertEquals(
    refusal.message,
    "Cannot submit: prompt token 1 is 100, outside the vocabulary of 100 ids",
  );
});
