import { assert, assertEquals, assertMatch } from "@std/assert";
import { postJson } from "./_http_harness.ts";

interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  attributes?: Array<{ key: string; value: Record<string, unknown> }>;
  events?: Array<{ name: string }>;
  links?: Array<{ traceId: string; spanId: string }>;
}

function attr(span: OtlpSpan, key: string): unknown {
  const v = span.attributes?.find((a) => a.key === key)?.value;
  return v === undefined ? undefined : Object.values(v)[0];
}

Deno.test("Deno's OTLP/JSON export carries the request span, its phases and linked step spans", async () => {
  const spans: OtlpSpan[] = [];
  const sink = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (req) => {
    if (new URL(req.url).pathname === "/v1/traces") {
      const body = await req.json();
      for (const rs of body.resourceSpans ?? []) {
        for (const ss of rs.scopeSpans ?? []) spans.push(...(ss.spans ?? []));
      }
    } else await req.body?.cancel();
    return Response.json({});
  });
  const sinkPort = (sink.addr as Deno.NetAddr).port;
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-net",
      "--allow-read",
      "--allow-env",
      new URL("./_serve_fake_child.ts", import.meta.url).pathname,
      "2000",
    ],
    env: {
      OTEL_DENO: "true",
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${sinkPort}`,
      OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
      OTEL_SERVICE_NAME: "llmserve-test",
    },
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  try {
    const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    let out = "";
    while (!out.includes("\n")) out += (await reader.read()).value ?? "";
    const port = Number(/listening (\d+)/.exec(out)![1]);
    const res = await postJson(`http://127.0.0.1:${port}/v1/completions`, {
      prompt: "trace me",
      max_tokens: 3,
    });
    const body = await res.json();
    child.kill("SIGTERM");
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      out += value;
    }
    assertMatch(out, /drained \{"completed":true/);
    assertEquals((await child.status).code, 0);

    const request = spans.filter((s) => s.name === "llm.request");
    assertEquals(request.length, 1, `spans: ${spans.map((s) => s.name).join(", ")}`);
    const r = request[0]!;
    assertEquals(attr(r, "llm.request.id"), body.id);
    assertEquals(String(attr(r, "gen_ai.usage.output_tokens")), "3");
    assertEquals(attr(r, "llm.finish_reason"), "length");
    assertEquals(r.events?.map((e) => e.name), ["queued", "started", "first_token", "done"]);
    // Deno.serve's own server span is the parent: the request span joins the HTTP trace.
    const server = spans.find((s) => s.spanId === r.parentSpanId);
    assertEquals([server?.name, server?.traceId], ["POST", r.traceId]);
    const phases = spans.filter((s) => s.parentSpanId === r.spanId);
    assertEquals(phases.map((s) => s.name).sort(), ["decode", "prefill", "queued"]);
    assert(phases.every((s) => s.traceId === r.traceId));
    const steps = spans.filter((s) => s.name === "llm.step");
    assertEquals(steps.length, 3);
    for (const s of steps) {
      assertEquals(s.links?.map((l) => [l.traceId, l.spanId]), [[r.traceId, r.spanId]]);
      assertEquals(String(attr(s, "llm.batch_size")), "1");
    }
  } finally {
    await sink.shutdown();
  }
});
