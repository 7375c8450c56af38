import {
  type Context,
  context,
  type ContextManager,
  ROOT_CONTEXT,
  type Span,
  trace,
} from "@opentelemetry/api";
import { assert, assertEquals, assertGreaterOrEqual } from "@std/assert";
import { createApp } from "../lib/http/app.ts";
import { FakeCore } from "./_fake_core.ts";
import type { GenerationEvent, GenerationRequest } from "../lib/core/generation.ts";
import { postJson } from "./_http_harness.ts";
import { RecordingTracer } from "./_recording_tracer.ts";

/** Synchronous context stack: enough to see which span is active when the core is called. */
class StackContextManager implements ContextManager {
  #stack: Context[] = [];
  active(): Context {
    return this.#stack.at(-1) ?? ROOT_CONTEXT;
  }
  with<A extends unknown[], F extends (...args: A) => ReturnType<F>>(
    ctx: Context,
    fn: F,
    thisArg?: ThisParameterType<F>,
    ...args: A
  ): ReturnType<F> {
    this.#stack.push(ctx);
    try {
      return fn.call(thisArg, ...args);
    } finally {
      this.#stack.pop();
    }
  }
  bind<T>(_ctx: Context, target: T): T {
    return target;
  }
  enable(): this {
    return this;
  }
  disable(): this {
    this.#stack = [];
    return this;
  }
}

/** Records the span that is active whenever the core is asked for its next event. */
class SpanSpyBackend extends FakeCore {
  activeSpans: Array<Span | undefined> = [];
  override generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent> {
    const inner = super.generate(req, signal)[Symbol.asyncIterator]();
    const spans = this.activeSpans;
    return {
      [Symbol.asyncIterator]: () => ({
        next: () => {
          spans.push(trace.getActiveSpan());
          return inner.next();
        },
        return: (v?: unknown) => inner.return?.(v) ?? Promise.resolve({ done: true, value: v }),
      }),
    };
  }
}

Deno.test("a request gets a span with token counts, priority, finish reason and phase children", async () => {
  const manager = new StackContextManager();
  assert(context.setGlobalContextManager(manager), "another context manager is registered");
  const tracer = new RecordingTracer();
  await using backend = new SpanSpyBackend({ tokenDelayMs: 2 });
  const service = createApp({ backend, tracer });
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, service.fetch);
  try {
    const base = `http://127.0.0.1:${(server.addr as Deno.NetAddr).port}`;
    const res = await postJson(base + "/v1/completions", {
      prompt: "trace this please",
      max_tokens: 4,
      priority: "batch",
    });
    const body = await res.json();
    const req = tracer.spans.filter((s) => s.name === "llm.request");
    assertEquals(req.length, 1);
    const span = req[0]!;
    assert(span.ended);
    assertEquals(span.parent, undefined);
    assertEquals(span.attributes["llm.request.id"], body.id);
    assertEquals(span.attributes["llm.priority"], "batch");
    assertEquals(
      span.attributes["gen_ai.usage.input_tokens"],
      11, // "trace this please" in tok512: [1, 259, 420, 412, 331, 308, 293, 282, 305, 412, 372]
    );
    assertEquals(span.attributes["gen_ai.usage.output_tokens"], 4);
    const repeated = [...span.setCounts].filter(([, n]) => n > 1).map(([k]) => k);
    assertEquals(repeated, [], "attributes set more than once on llm.request");
    assertEquals(span.attributes["llm.finish_reason"], "length");
    assertEquals(span.attributes["gen_ai.request.max_tokens"], 4);
    assertEquals(span.events, ["queued", "started", "first_token", "done"]);
    // Phase spans from the core's timings, children of the request span, in order.
    const phases = tracer.spans.filter((s) => s.parent === span);
    assertEquals(phases.map((s) => s.name), ["queued", "prefill", "decode"]);
    for (let i = 0; i < phases.length; i++) {
      const p = phases[i]!;
      assert(p.ended && p.startTime !== undefined && p.endTime !== undefined);
      assertGreaterOrEqual(p.endTime, p.startTime);
      if (i > 0) assertEquals(p.startTime, phases[i - 1]!.endTime);
    }
    // Every call into the core ran with the request span active (so step spans can link to it).
    assertGreaterOrEqual(backend.activeSpans.length, 6);
    assert(backend.activeSpans.every((s) => s === span));
  } finally {
    service.close();
    await server.shutdown();
    context.disable();
  }
});
