import { assertEquals } from "@std/assert";
import { trace } from "@opentelemetry/api";
import type { GenerationEvent, GenerationRequest } from "../lib/core/generation.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { InFlightRegistry } from "../lib/http/inflight.ts";
import { RequestLog } from "../lib/http/request_log.ts";
import { ServiceMetrics } from "../lib/http/service_metrics.ts";
import { trackGeneration } from "../lib/http/tracked_generation.ts";
import { FakeCore } from "./_fake_core.ts";

/**
 * The fake core, whose generator (like the real one) may still be finishing (releasing its
 * sequence) after its last event: here its finally block waits for `cleanup`.
 */
class SlowCleanupCore extends FakeCore {
  constructor(readonly cleanup: Promise<void>) {
    super();
  }
  override async *generate(
    req: GenerationRequest,
    signal: AbortSignal,
  ): AsyncGenerator<GenerationEvent> {
    try {
      yield* super.generate(req, signal);
    } finally {
      await this.cleanup;
    }
  }
}

Deno.test("a generation whose done the client has handled is no longer in flight while the core still cleans up", async () => {
  let release!: () => void;
  const cleanup = new Promise<void>((r) => release = r);
  const inflight = new InFlightRegistry();
  await using backend = new SlowCleanupCore(cleanup);
  const deps = {
    backend,
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
  assertEquals(seen, ["started", "token", "done"]);
  assertEquals(inflight.size, 0);
});
