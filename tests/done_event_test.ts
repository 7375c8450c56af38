import { assertEquals } from "@std/assert";
import { doneEvent, generationTimings } from "../lib/core/done_event.ts";

Deno.test("generationTimings(): each phase from the clock, by hand; time to first token = queued + prefill", () => {
  // Arrived at 100, admitted at 130, first token at 180, 11 tokens by 380: 10 decode steps in 200 ms.
  assertEquals(generationTimings({ start: 100, scheduled: 130, firstToken: 180, end: 380 }, 11), {
    queuedMs: 30,
    prefillMs: 50,
    timeToFirstTokenMs: 80,
    decodeMs: 200,
    totalMs: 280,
    decodeTokensPerSecond: 50,
  });
});

Deno.test("generationTimings(): phases that never came collapse onto the end; one token has no decode rate", () => {
  // Cancelled in the queue: all of it was queueing.
  assertEquals(generationTimings({ start: 10, end: 25 }, 0), {
    queuedMs: 15,
    prefillMs: 0,
    timeToFirstTokenMs: 15,
    decodeMs: 0,
    totalMs: 15,
    decodeTokensPerSecond: 0,
  });
  // A side that cannot see the queue (a router, a replay) passes scheduled = start.
  assertEquals(generationTimings({ start: 0, scheduled: 0, firstToken: 40, end: 40 }, 1), {
    queuedMs: 0,
    prefillMs: 40,
    timeToFirstTokenMs: 40,
    decodeMs: 0,
    totalMs: 40,
    decodeTokensPerSecond: 0,
  });
});

Deno.test("doneEvent(): the usage as given, timings from a clock over its completion tokens or passed on whole, a cache hit when there is one", () => {
  const usage = { promptTokens: 7, completionTokens: 3, cachedTokens: 2 };
  assertEquals(doneEvent("stop", usage, { start: 0, scheduled: 0, firstToken: 10, end: 30 }), {
    type: "done",
    finishReason: "stop",
    usage,
    timings: {
      queuedMs: 0,
      prefillMs: 10,
      timeToFirstTokenMs: 10,
      decodeMs: 20,
      totalMs: 30,
      decodeTokensPerSecond: 100,
    },
  });
  const measured = {
    queuedMs: 1,
    prefillMs: 2,
    timeToFirstTokenMs: 3,
    decodeMs: 4,
    totalMs: 7,
    decodeTokensPerSecond: 500,
  };
  assertEquals(doneEvent("length", usage, measured, { savedMs: 9 }), {
    type: "done",
    finishReason: "length",
    usage,
    timings: measured,
    cached: { savedMs: 9 },
  });
  // Without an end the clock ends now.
  const t = performance.now();
  const now = doneEvent("cancelled", usage, { start: t }).timings;
  assertEquals(now.totalMs >= 0 && now.totalMs < 1000, true);
});
