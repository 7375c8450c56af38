import { assert, assertEquals } from "@std/assert";
import { otlpAttr, startOtlpCollector } from "./_otlp_collector.ts";
import { spawnServer } from "./_serve_child.ts";

Deno.test("the real server exports a request span with its phases and step spans linked to it", async () => {
  const collector = startOtlpCollector();
  const { spans } = collector;
  const { child, base, log } = await spawnServer([], { env: collector.env });
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-request-id": "trace-req-1" },
      body: JSON.stringify({ prompt: "Once upon a time", max_tokens: 5, temperature: 0 }),
    });
    assertEquals(res.status, 200);
    assertEquals(res.headers.get("x-request-id"), "trace-req-1");
    await res.json();
    child.kill("SIGTERM");
    assertEquals((await child.status).code, 0, await log());

    const request = spans.filter((s) => s.name === "llm.request");
    assertEquals(request.length, 1, `spans: ${spans.map((s) => s.name).join(", ")}`);
    const r = request[0]!;
    assertEquals(otlpAttr(r, "gen_ai.usage.output_tokens"), "5");
    // The client's x-request-id is on the request span and on Deno.serve's HTTP span above it.
    assertEquals(otlpAttr(r, "llm.request.id"), "trace-req-1");
    const http = spans.find((s) => s.spanId === r.parentSpanId);
    assert(http !== undefined, `no parent span; spans: ${spans.map((s) => s.name).join(", ")}`);
    assertEquals(otlpAttr(http!, "llm.request.id"), "trace-req-1");
    const phases = spans.filter((s) => s.parentSpanId === r.spanId).map((s) => s.name).sort();
    assertEquals(phases, ["decode", "prefill", "queued"]);
    const steps = spans.filter((s) => s.name === "llm.step");
    // One prefill step and at least one decode step per generated token after the first.
    assert(steps.length >= 5, `expected >= 5 step spans, got ${steps.length}`);
    for (const s of steps) {
      assertEquals(s.links?.map((l) => [l.traceId, l.spanId]), [[r.traceId, r.spanId]]);
      assertEquals(otlpAttr(s, "llm.batch_size"), "1");
    }
    assertEquals(
      steps.map((s) => otlpAttr(s, "llm.step.tokens")).filter((t) => t === "5").length,
      1,
      "one 5-token prefill step",
    );
  } finally {
    await collector.close();
  }
});
