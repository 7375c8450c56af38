import { assert, assertEquals, assertGreater, assertGreaterOrEqual, assertLess } from "@std/assert";
import { ServingCore } from "../actors/core.ts";
import { GREEDY, type StepPlan, type StepResult } from "../lib/engine/engine.ts";
import { fakeContinuation, FakeEngine, type FakeEngineOptions } from "./harness/fake_engine.ts";
import type { GenerationEvent, GenerationRequest } from "../lib/core/generation.ts";
import type { SchedulerConfig } from "../lib/core/scheduler.ts";
import { BOS, decodeAll, EOS, fakeCodec, piece } from "./_fake_codec.ts";
import { closeCore } from "./_serving_core.ts";
import { Channel } from "../actors/channel.ts";
import type { SchedulerMsg } from "../actors/messages.ts";
import { RequestActor, requestMailboxCapacity } from "../actors/request.ts";

const VOCAB = 64;

function startCore(engine: FakeEngineOptions = {}, scheduler: Partial<SchedulerConfig> = {}) {
  const opts = { vocabSize: VOCAB, numBlocks: 128, blockSize: 4, contextLength: 512, ...engine };
  return new ServingCore({
    engine: new FakeEngine(opts),
    engineFactory: () => new FakeEngine(opts),
    codec: fakeCodec,
    scheduler,
  });
}

function request(
  prompt: number[],
  maxTokens: number,
  extra: Partial<GenerationRequest> = {},
): GenerationRequest {
  return {
    prompt,
    maxTokens,
    sampling: GREEDY,
    stop: [],
    priority: "interactive",
    requestId: "t",
    ...extra,
  };
}

/** What the fake model generates for the prompt, EOS included if it stops there. */
function continuation(prompt: number[], maxTokens: number): number[] {
  return fakeContinuation(prompt, {
    maxTokens,
    stopTokenIds: [EOS],
    contextLength: 512,
    vocabSize: VOCAB,
    sampling: GREEDY,
  });
}

/** A prompt (after BOS) whose continuation has at least `n` tokens before any EOS. */
function promptWithLongRun(n: number, seed = 0): number[] {
  for (let k = seed;; k++) {
    const p = [BOS, 4 + (k % 50), 5 + ((k * 7) % 50), 2 + ((k * 13) % 60)];
    if (!continuation(p, n).includes(EOS)) return p;
  }
}

async function collect(events: AsyncIterable<GenerationEvent>): Promise<GenerationEvent[]> {
  const out: GenerationEvent[] = [];
  for await (const e of events) out.push(e);
  return out;
}

function textOf(events: GenerationEvent[]): string {
  return events.map((e) => (e.type === "token" ? e.text : "")).join("");
}

function doneOf(events: GenerationEvent[]) {
  const d = events.at(-1);
  if (d?.type !== "done") throw new Error(`expected done last, got ${JSON.stringify(d)}`);
  return d;
}

/**
 * Polls until `cond` holds (a final probe of the scheduler's state). `ms` only keeps a broken
 * run from hanging: it is far above what any machine takes, and no assertion is about time.
 */
async function waitFor(what: string, cond: () => boolean, ms = 60_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 1));
  }
}

/** True once no sequence is live and every KV block is back in the pool. */
function idle(core: ServingCore): boolean {
  const s = core.schedulerStats();
  return s.running === 0 && s.waiting === 0 && s.kvBlocksUsed === 0;
}

Deno.test("RequestActor streams text deltas that add up to the decoded continuation, then done with usage", async () => {
  const core = startCore();
  try {
    const prompt = promptWithLongRun(40);
    const events = await collect(core.generate(request(prompt, 40)));
    assertEquals(events[0], { type: "started", promptTokens: prompt.length });
    const want = continuation(prompt, 40);
    assertEquals(textOf(events), decodeAll(want));
    const ids = events.flatMap((e) => (e.type === "token" ? e.ids : []));
    assertEquals(ids, want, "every generated id is reported once, in order");
    assert(
      events.some((e) => e.type === "token" && e.ids.length > 1),
      "ids without text wait for the next text",
    );
    assert(
      events.every((e) => e.type !== "token" || e.text.length > 0),
      "no empty deltas mid-stream",
    );
    const done = doneOf(events);
    assertEquals(done.finishReason, "length");
    assertEquals(done.usage, {
      promptTokens: prompt.length,
      completionTokens: 40,
      cachedTokens: 0,
    });
  } finally {
    await closeCore(core);
  }
});

Deno.test("RequestActor reports an EOS stop without its text, the EOS counted as generated", async () => {
  const core = startCore();
  try {
    // Find a prompt text whose continuation hits EOS early.
    let text = "", want: number[] = [];
    for (let k = 1; k < 500; k++) {
      text = k.toString(4).replace(/[0-3]/g, (d) => "ab c"[Number(d)]!);
      want = continuation(fakeCodec.encode(text), 100);
      if (want.at(-1) === EOS && want.length > 3) break;
    }
    assertEquals(want.at(-1), EOS, "test setup: no prompt found that stops early");
    const events = await collect(core.generate(request(fakeCodec.encode(text), 100)));
    const done = doneOf(events);
    assertEquals(done.finishReason, "stop");
    assertEquals(done.usage.completionTokens, want.length, "the EOS token counts as generated");
    assertEquals(done.usage.promptTokens, text.length + 1);
    assertEquals(textOf(events), decodeAll(want.slice(0, -1)));
    assert(!events.some((e) => e.type === "token" && e.ids.includes(EOS)), "EOS is not streamed");
  } finally {
    await closeCore(core);
  }
});

Deno.test("RequestActor ends at a stop string, never emits any part of it, and frees the sequence", async () => {
  const core = startCore();
  try {
    const prompt = promptWithLongRun(60, 3);
    const full = decodeAll(continuation(prompt, 60));
    let checked = 0;
    for (let at = 5; at < full.length - 4; at += 7) {
      for (const len of [1, 2, 3]) {
        const stop = full.slice(at, at + len);
        const cut = full.indexOf(stop);
        const events = await collect(core.generate(request(prompt, 60, { stop: ["zzz", stop] })));
        assertEquals(textOf(events), full.slice(0, cut), `stop ${JSON.stringify(stop)}`);
        assertEquals(doneOf(events).finishReason, "stop");
        checked++;
      }
    }
    assertGreater(checked, 10);
    await waitFor("the stopped sequences to be freed", () => idle(core));
  } finally {
    await closeCore(core);
  }
});

Deno.test("RequestActor holds back text that may start a stop string and releases it when it does not", async () => {
  const core = startCore();
  try {
    const prompt = promptWithLongRun(60, 11);
    const want = continuation(prompt, 60);
    const full = decodeAll(want);
    // "a" + "z" never completes, but every "a" may be its start.
    const events = await collect(core.generate(request(prompt, 60, { stop: ["az"] })));
    assertEquals(textOf(events), full, "all held-back text is released by the end");
    assertEquals(doneOf(events).finishReason, "length");
    let emitted = "", reported: number[] = [], heldBack = 0;
    for (const e of events) {
      if (e.type !== "token") continue;
      emitted += e.text;
      reported = reported.concat(e.ids);
      // Held text keeps its ids: what the ids say was sent is what was sent (a router's
      // failover resubmits after them).
      assertEquals(decodeAll(reported), emitted);
      // A held token comes out with the next one. Only a possible stop-string start is held
      // (a token ending in "a"), besides what the decoder holds (odd ids: half a character).
      for (const id of e.ids.slice(0, -1)) {
        if (id % 2 === 1) continue;
        heldBack++;
        assert(piece(id).endsWith("a"), `token ${id} was held: ${JSON.stringify(e)}`);
      }
    }
    assertGreater(heldBack, 0, "some text ending in 'a' was held back");
  } finally {
    await closeCore(core);
  }
});

Deno.test("RequestActor: aborting the signal cancels with done('cancelled') and frees the blocks at once", async () => {
  const core = startCore({ latencyMs: 2 });
  try {
    const prompt = promptWithLongRun(200, 5);
    const ctl = new AbortController();
    const events: GenerationEvent[] = [];
    for await (const e of core.generate(request(prompt, 200), ctl.signal)) {
      events.push(e);
      if (events.filter((x) => x.type === "token").length === 5) ctl.abort();
    }
    const done = doneOf(events);
    assertEquals(done.finishReason, "cancelled");
    const ids = events.flatMap((e) => (e.type === "token" ? e.ids : []));
    assertEquals(ids, continuation(prompt, 200).slice(0, ids.length));
    assertLess(done.usage.completionTokens, 200);
    await waitFor("the cancelled sequence to be freed", () => idle(core));
  } finally {
    await closeCore(core);
  }
});

Deno.test("RequestActor: a signal aborted before the start ends at once with done('cancelled')", async () => {
  const core = startCore({ latencyMs: 1 });
  try {
    const events = await collect(
      core.generate(request(promptWithLongRun(50), 50), AbortSignal.abort()),
    );
    assertEquals(events.map((e) => e.type), ["done"]);
    assertEquals(doneOf(events).finishReason, "cancelled");
    assertEquals(doneOf(events).usage.completionTokens, 0);
    await waitFor("nothing to be live", () => idle(core));
  } finally {
    await closeCore(core);
  }
});

Deno.test("RequestActor: a client that leaves mid-stream frees its sequence", async () => {
  const core = startCore({ latencyMs: 2 });
  try {
    let tokens = 0;
    for await (const e of core.generate(request(promptWithLongRun(300, 2), 300))) {
      if (e.type === "token" && ++tokens === 3) break;
    }
    await waitFor("the abandoned sequence to be freed", () => idle(core));
    const s = core.schedulerStats();
    assertLess(s.steps, 150, "the sequence stopped long before its 300 tokens");
  } finally {
    await closeCore(core);
  }
});

Deno.test("RequestActor: a client that stops reading does not hold up the others", async () => {
  const core = startCore({ latencyMs: 1 });
  try {
    const stalled = core.generate(request(promptWithLongRun(200, 8), 200));
    await stalled.next(); // started, then never read again
    const prompt = promptWithLongRun(100, 9);
    const events = await collect(core.generate(request(prompt, 100)));
    assertEquals(textOf(events), decodeAll(continuation(prompt, 100)));
    const s = core.schedulerStats();
    assertEquals(s.running, 1, "the stalled generation is still running, not blocking");
    await stalled.return(undefined);
    await waitFor("the stalled sequence to be freed", () => idle(core));
  } finally {
    await closeCore(core);
  }
});

Deno.test("RequestActor refuses a prompt longer than the context as the first event", async () => {
  const core = startCore({ contextLength: 16 });
  try {
    const events = await collect(core.generate(request(Array(16).fill(5), 4)));
    assertEquals(events.length, 1);
    const e = events[0]!;
    if (e.type !== "error") throw new Error(`expected an error, got ${JSON.stringify(e)}`);
    assertEquals(e.code, "context_length_exceeded");
    assert(e.message.includes("16 tokens"), e.message);
  } finally {
    await closeCore(core);
  }
});

Deno.test("RequestActor after drain() answers 'draining' while running generations finish", async () => {
  const core = startCore({ latencyMs: 1 });
  try {
    const prompt = promptWithLongRun(30, 4);
    const gen = core.generate(request(prompt, 30));
    // Drained once the first generation has started (its first event), not after a guessed delay.
    assertEquals((await gen.next()).value?.type, "started");
    const first = collect(gen);
    await core.drain();
    const refused = await collect(core.generate(request(prompt, 30)));
    assertEquals(refused.map((e) => e.type === "error" && e.code), ["draining"]);
    assertEquals(textOf(await first), decodeAll(continuation(prompt, 30)));
  } finally {
    await closeCore(core);
  }
});

/** A fake engine that logs each step's sequences (and a prefill's tokens) and counts steps. */
class StepLogEngine extends FakeEngine {
  readonly log: { seqId: number; tokens: readonly number[] }[][] = [];
  finished = 0;
  override async step(plan: StepPlan): Promise<StepResult> {
    this.log.push(plan.seqs.map((s) => ({ seqId: s.seqId, tokens: s.tokens })));
    const result = await super.step(plan);
    this.finished++;
    return result;
  }
}

Deno.test("RequestActor reports timings: queue, prefill, first token and decode rate add up", async () => {
  // Timings on a logical clock of 3 ms per finished engine step: they count steps, so the
  // relations below hold on any machine. A step's result comes on a timer (a macrotask) and
  // the actors read the clock as they handle messages (microtasks), so with one step at a time
  // each reading sees exactly the steps finished before the message was sent.
  const STEP_MS = 3;
  const engine = new StepLogEngine({
    vocabSize: VOCAB,
    numBlocks: 128,
    blockSize: 4,
    contextLength: 512,
    latencyMs: 1,
  });
  const core = new ServingCore({
    engine,
    engineFactory: () => engine,
    codec: fakeCodec,
    scheduler: { maxRunning: 1 },
    maxInFlight: 1,
    now: () => engine.finished * STEP_MS,
  });
  try {
    const p1 = promptWithLongRun(20, 1), p2 = promptWithLongRun(20, 6);
    const [a, b] = await Promise.all([
      collect(core.generate(request(p1, 20))),
      collect(core.generate(request(p2, 20))),
    ]);
    const ta = doneOf(a).timings, tb = doneOf(b).timings;
    for (const t of [ta, tb]) {
      for (const v of Object.values(t)) assert(v >= 0 && Number.isFinite(v), JSON.stringify(t));
      assert(Math.abs(t.timeToFirstTokenMs - (t.queuedMs + t.prefillMs)) < 1e-6);
      assert(Math.abs(t.totalMs - (t.timeToFirstTokenMs + t.decodeMs)) < 1e-6);
      assertGreaterOrEqual(t.prefillMs, STEP_MS, "the first token needs at least one step");
      // The 19 tokens after the first take at least 19 more steps.
      assertGreaterOrEqual(t.decodeMs, 19 * STEP_MS, JSON.stringify(t));
      assert(Math.abs(t.decodeTokensPerSecond - 19 / (t.decodeMs / 1000)) < 1e-6);
    }
    // With one running slot no step holds both, and the second runs only after the whole first.
    const order = engine.log.map((step) => {
      assertEquals(step.length, 1, "one sequence a step");
      return step[0]!.seqId;
    });
    const switchAt = order.findIndex((id) => id !== order[0]);
    assertGreater(switchAt, 0, `both sequences ran: ${order.join()}`);
    assert(order.slice(switchAt).every((id) => id !== order[0]), order.join());
    // The first step is the first sequence's prefill: its prompt tells which request it is.
    const prefill = engine.log[0]![0]!.tokens.join();
    assert(prefill === p1.join() || prefill === p2.join(), prefill);
    const [first, second] = prefill === p1.join() ? [ta, tb] : [tb, ta];
    // The second waited in the queue for the first's 20 steps (1 prefill, 19 decodes).
    assertGreaterOrEqual(second.queuedMs, 20 * STEP_MS, JSON.stringify({ first, second }));
    assertLess(first.queuedMs, second.queuedMs);
  } finally {
    await closeCore(core);
  }
});

Deno.test("A client that stops reading holds its sequence: the engine decodes nothing more for it until it reads again", async () => {
  const engine = new FakeEngine({
    vocabSize: VOCAB,
    numBlocks: 128,
    blockSize: 4,
    contextLength: 512,
  });
  const core = new ServingCore({
    engine,
    engineFactory: () => engine,
    codec: fakeCodec,
    clientBuffer: 4,
  });
  try {
    const prompt = promptWithLongRun(300, 3);
    const it = core.generate(request(prompt, 300))[Symbol.asyncIterator]();
    const got: GenerationEvent[] = [];
    for (let i = 0; i < 3; i++) got.push((await it.next()).value!);
    // The client now reads nothing. Once the hold has reached the scheduler, nothing is
    // planned for the sequence: it stays running with no step in flight (an event, not a nap).
    await waitFor("the sequence to be held", () => {
      const s = core.schedulerStats();
      return s.running === 1 && s.stepsInFlight === 0;
    });
    const computed = engine.tokensComputed;
    // Everything computed fits in what was read, the 4-event buffer, the request actor's
    // event in hand and the steps that were in flight: far from the 300 asked for.
    const bound = prompt.length + 3 + 4 + 1 + 3 + 8;
    assert(computed <= bound, `the engine computed ${computed} tokens, bound ${bound}`);
    // Reading again resumes it, and the tokens are the solo run's.
    for (let e = await it.next(); !e.done; e = await it.next()) got.push(e.value);
    const ids = got.flatMap((e) => (e.type === "token" ? e.ids : []));
    assertEquals(ids, continuation(prompt, 300));
    assertEquals(doneOf(got).finishReason, "length");
  } finally {
    await closeCore(core);
  }
});

Deno.test("RequestActor: a mailbox overflow (more events than its sequence can get) fails the generation with an error naming it", async () => {
  const mailbox = new Channel<SchedulerMsg>(8);
  const scheduler = { mailbox, nextSeqId: () => 7 };
  const maxTokens = 2;
  const sink = new Channel<GenerationEvent>(64);
  const actor = new RequestActor(scheduler, fakeCodec, request([BOS, 4, 5], maxTokens), sink);
  assertEquals(actor.mailbox.capacity, requestMailboxCapacity(maxTokens));
  const running = actor.run().finally(() => sink.close());
  const submit = (await mailbox.receive()).value;
  if (submit?.type !== "submit") throw new Error(`expected a submit, got ${submit?.type}`);
  const reply = submit.reply;
  // A scheduler bug: more token events than max_tokens allows, all before the actor reads.
  reply({ type: "accepted", seqId: 7, promptTokens: 3 });
  reply({ type: "scheduled", seqId: 7, cachedTokens: 0 });
  for (let i = 0; i < actor.mailbox.capacity; i++) {
    reply({ type: "token", seqId: 7, token: 4, logprob: 0, stepId: i });
  }
  const events = await collect(sink);
  await running;
  const last = events.at(-1)!;
  assertEquals(last.type, "error");
  assert(
    last.type === "error" &&
      /request mailbox \(capacity 7\) was full and lost a "token"/.test(last.message),
    JSON.stringify(last),
  );
  // It also told the scheduler to drop the sequence.
  const msgs: string[] = [];
  for (let m = mailbox.tryReceive(); m && !m.done; m = mailbox.tryReceive()) {
    msgs.push(m.value.type);
  }
  assert(msgs.includes("client-gone"), msgs.join());
});
