/**
 * A burst of 32 prompts against running decodes, through the Scheduler and the fake engine,
 * with step costs from a known cost model (40 ms a step + 12 ms a row + 30 ms a sampled row,
 * reported as each step's busy time): the burst is cut into steps between prompts, each prompt's first token comes in
 * the step that finishes its own prefill, and the decodes already running get a token in every
 * step. Asserted on the plans and the token events, not on timings.
 */
import { assert, assertEquals, assertGreater, assertLess } from "@std/assert";
import { GREEDY, stepTokens } from "../lib/engine/engine.ts";
import { Scheduler, schedulerConfig } from "../lib/core/scheduler.ts";
import type { SeqEvent } from "../lib/core/seq_events.ts";
import { fakeContinuation, FakeEngine } from "./harness/fake_engine.ts";

const FIXED_MS = 40, ROW_MS = 12, SAMPLE_MS = 30;
const PROMPT = 11, BURST = 32;

interface StepLog {
  readonly stepId: number;
  readonly rows: number;
  /** Sequences whose last prompt chunk (the one that samples) is in the step. */
  readonly prefillDone: number[];
  /** Sequences that sample a token in the step. */
  readonly sampled: number[];
}

function setup(reportCost: boolean) {
  const engine = new FakeEngine({ vocabSize: 64, numBlocks: 256 });
  const events: SeqEvent[] = [];
  const sched = new Scheduler(
    schedulerConfig({
      ...engine.kv,
      contextLength: engine.config.contextLength,
      vocabSize: engine.config.vocabSize,
    }),
    (e) => events.push(e),
  );
  const log: StepLog[] = [];
  let nextId = 1;
  const submit = (prompt: number[], maxTokens: number) => {
    const seqId = nextId++;
    sched.submit({
      seqId,
      prompt,
      maxTokens,
      sampling: GREEDY,
      stopTokenIds: [],
      priority: "interactive",
    });
    return seqId;
  };
  const step = () => {
    const plan = sched.schedule();
    if (!plan) return false;
    const rows = stepTokens(plan);
    log.push({
      stepId: plan.stepId,
      rows,
      prefillDone: plan.seqs.filter((s) =>
        s.sample && s.tokens.length > 0 && !s.useLastSampled &&
        s.startPos + s.tokens.length === PROMPT
      ).map((s) => s.seqId),
      sampled: plan.seqs.filter((s) => s.sample).map((s) => s.seqId),
    });
    const result = engine.run(plan);
    const cost = FIXED_MS + ROW_MS * rows + SAMPLE_MS * result.sampled.length;
    sched.onResult(result, reportCost ? cost : undefined);
    return true;
  };
  return { sched, events, log, submit, step };
}

const promptOf = (i: number) => Array.from({ length: PROMPT }, (_, k) => (i * 7 + k * 3) % 60 + 1);

/** Two long decodes running, then a burst of 32 prompts; returns the burst's ids and the run. */
function burstBesideDecodes(reportCost: boolean) {
  const t = setup(reportCost);
  // Two decodes start one after the other; their steps teach the scheduler the cost model.
  const running = [t.submit(promptOf(100), 400)];
  t.step();
  running.push(t.submit([5, 6, 7], 400));
  for (let i = 0; i < 5; i++) t.step();
  const from = t.log.length;
  const burst = Array.from({ length: BURST }, (_, i) => t.submit(promptOf(i), 3));
  while (burst.some((id) => !t.events.some((e) => e.type === "finished" && e.seqId === id))) {
    assert(t.step(), "the scheduler stalled");
  }
  return { ...t, running, burst, burstLog: t.log.slice(from) };
}

Deno.test("Scheduler: a burst of 32 prompts gives each its first token as its own prefill finishes, while running decodes get a token every step", () => {
  const { events, running, burst, burstLog } = burstBesideDecodes(true);
  const firstTokenStep = new Map<number, number>();
  for (const e of events) {
    if (e.type === "token" && !firstTokenStep.has(e.seqId)) firstTokenStep.set(e.seqId, e.stepId);
  }
  const prefillStep = new Map<number, number>();
  for (const s of burstLog) for (const id of s.prefillDone) prefillStep.set(id, s.stepId);
  for (const id of burst) {
    assertEquals(
      firstTokenStep.get(id),
      prefillStep.get(id),
      `seq ${id}: first token from its own last prefill step`,
    );
  }
  // Cut between prompts. A step without prompts costs 40 + (12 + 30) × 2 decodes = 124 ms, a
  // prompt 12 × 11 + 30 = 162 ms: √(32 × 124 / 162) = 4.95 prompts, 54.4 rows a step, so
  // prompts of 11 join a step while it holds fewer than 54.4 prompt rows: 5 of them.
  const firstCut = burstLog[0]!.prefillDone.length;
  assertEquals(firstCut, 5);
  const steps = new Set(burst.map((id) => firstTokenStep.get(id)));
  assertGreater(steps.size, 2, "first tokens spread over the burst's steps");
  const order = burst.map((id) => firstTokenStep.get(id)!);
  assertEquals(order, [...order].sort((a, b) => a - b), "in arrival order");
  assertLess(
    order[0]!,
    prefillStep.get(burst.at(-1)!)!,
    "the first came before the last prefill was planned",
  );
  // The decodes already running: one token in every step of the burst.
  for (const s of burstLog) {
    for (const id of running) {
      assert(s.sampled.includes(id), `step ${s.stepId} left seq ${id} without a token`);
    }
  }
});

Deno.test("Scheduler: without step costs a burst is not cut (all 32 prefills in one step)", () => {
  const { burstLog } = burstBesideDecodes(false);
  assertEquals(burstLog[0]!.prefillDone.length, BURST);
});

Deno.test("Scheduler: a burst cut into steps still gives every sequence the fake model's continuation", () => {
  const { events, burst } = burstBesideDecodes(true);
  for (const [i, id] of burst.entries()) {
    const got = events.filter((e) => e.type === "token" && e.seqId === id).map((e) =>
      e.type === "token" ? e.token : -1
    );
    assertEquals(
      got,
      fakeContinuation(promptOf(i), {
        maxTokens: 3,
        contextLength: 2048,
        vocabSize: 64,
        sampling: GREEDY,
      }),
    );
  }
});
