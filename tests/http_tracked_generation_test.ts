import { assertEquals } from "@std/assert";
import { trace } from "@opentelemetry/api";
import type { GenerationBackend, GenerationEvent } from "../lib/core/generation.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { InFlightRegistry } from "../lib/http/inflight.ts";
import { RequestLog } from "../lib/http/request_log.ts";
import { ServiceMetrics } from "../lib/http/service_metrics.ts";
import { trackGeneration } from "../lib/http/tracked_generation.ts";

const DONE: GenerationEvent = {
  type: "done",
  finishReason: "length",
  usage: { promptTokens: 1, completionTokens: 1, cachedTokens: 0 },
  timings: { queuedMs: 0, prefillMs: 0, decodeMs: 0, totalMs: 0, ttftMs: 0 } as never,
};

/**
 * A core whose generator, like the real one, may still be finishing (releasing its sequence)
 * after its last event: its finally block waits for `cleanup`.
 */
function slowCleanupBackend(cleanup: Promise<void>): GenerationBackend {
  return {
    async *generate() {
      try {
        yield { type: "started", promptTokens: 1 } as GenerationEvent;
        yield DONE;
      } finally {
        await cleanup;
      }
    },
  } as unknown as GenerationBackend;
}

Deno.test("a generation whose done the client has handled is no longer in flight while the core still cleans up", async () => {
  let release!: () => void;
  const cleanup = new Promise<void>((r) => release = r);
  const inflight = new InFlightRegistry();
  const deps = {
    backend: slowCleanupBackend(cleanup),
    metrics: new ServiceMetrics(),
    tracer: trace.getTracer("test"),
    inflight,
    isDraining: () => false,
    requestLog: new RequestLog("off"),
  };
  const request = {
    prompt: [1],
    maxTokens: 1,
    sampling: GREEDY,
    stop: [],
    priority: "interactive" as const,
    requestId: "r1",
  };
  const events = trackGeneration(deps, request, "completions", new AbortController().signal);
  const seen: string[] = [];
  for (;;) {
    const step = await events.next();
    if (step.done) break;
    seen.push(step.value.type);
    // While the client holds the started event, the generation is in flight.
    if (step.value.type === "started") assertEquals(inflight.size, 1);
    if (step.value.type === "done") break;
  }
  // The client has handled done and lets go; the core is still cleaning up.
  const ending = events.return(undefined);
  // A gauge or a drain still counting it would over-count.
  assertEquals(await inflight.whenIdle(5_000), true);
  assertEquals(inflight.size, 0);
  release();
  await ending;
  assertEquals(seen, ["started", "done"]);
  assertEquals(inflight.size, 0);
});
