import { assert, assertEquals } from "@std/assert";
import { spawnServer } from "./_serve_child.ts";

interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  attributes?: Array<{ key: string; value: Record<string, unknown> }>;
  links?: Array<{ traceId: string; spanId: string }>;
}

const attr = (span: OtlpSpan, key: string) => {
  const v = span.attributes?.find((a) => a.key === key)?.value;
  return v === undefined ? undefined : String(Object.values(v)[0]);
};

Deno.test("the real server exports a request span with its phases and step spans linked to it", async () => {
  const spans: OtlpSpan[] = [];
  const collector = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (req) => {
    if (new URL(req.url).pathname === "/v1/traces") {
      const body = await req.json();
      for (const rs of body.resourceSpans ?? []) {
        for (const ss of rs.scopeSpans ?? []) spans.push(...(ss.spans ?? []));
      }
    } else await req.body?.cancel();
    return Response.json({});
  });
  const { child, base, log } = await spawnServer([], {
    env: {
      OTEL_DENO: "true",
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${(collector.addr as Deno.NetAddr).port}`,
      OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
    },
  });
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "Once upon a time", max_tokens: 5, temperature: 0 }),
    });
    assertEquals(res.status, 200);
    await res.json();
    child.kill("SIGTERM");
    assertEquals((await child.status).code, 0, await log());

    const request = spans.filter((s) => s.name === "llm.request");
    assertEquals(request.length, 1, `spans: ${spans.map((s) => s.name).join(", ")}`);
    const r = request[0]!;
    assertEquals(attr(r, "gen_ai.usage.output_tokens"), "5");
    const phases = spans.filter((s) => s.parentSpanId === r.spanId).map((s) => s.name).sort();
    assertEquals(phases, ["decode", "prefill", "queued"]);
    const steps = spans.filter((s) => s.name === "llm.step");
    // One prefill step and at least one decode step per generated token after the first.
    assert(steps.length >= 5, `expected >= 5 step spans, got ${steps.length}`);
    for (const s of steps) {
      assertEquals(s.links?.map((l) => [l.traceId, l.spanId]), [[r.traceId, r.spanId]]);
      assertEquals(attr(s, "llm.batch_size"), "1");
    }
    assertEquals(
      steps.map((s) => attr(s, "llm.step.tokens")).filter((t) => t === "5").length,
      1,
      "one 5-token prefill step",
    );
  } finally {
    await collector.shutdown();
  }
});
