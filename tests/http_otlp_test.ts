import { assert, assertEquals, assertMatch } from "@std/assert";
import { postJson } from "./_http_harness.ts";
import { otlpAttr, startOtlpCollector } from "./_otlp_collector.ts";

Deno.test("Deno's OTLP/JSON export carries the request span, its phases and linked step spans", async () => {
  const sink = startOtlpCollector();
  const { spans } = sink;
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-net",
      "--allow-read",
      "--allow-env",
      new URL("./_serve_fake_child.ts", import.meta.url).pathname,
      "2000",
    ],
    env: { ...sink.env, OTEL_SERVICE_NAME: "llmserve-test" },
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
    assertEquals(otlpAttr(r, "llm.request.id"), body.id);
    assertEquals(String(otlpAttr(r, "gen_ai.usage.output_tokens")), "3");
    assertEquals(otlpAttr(r, "llm.finish_reason"), "length");
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
      assertEquals(String(otlpAttr(s, "llm.batch_size")), "1");
    }
  } finally {
    await sink.close();
  }
});
