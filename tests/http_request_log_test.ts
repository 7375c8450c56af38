import { assert, assertEquals, assertMatch } from "@std/assert";
import { context } from "@opentelemetry/api";
import { createApp } from "../lib/http/app.ts";
import {
  formatText,
  RequestLog,
  type RequestLogEntry,
  type RequestLogOptions,
} from "../lib/http/request_log.ts";
import { FakeCore } from "./_fake_core.ts";
import { RecordingTracer } from "./_recording_tracer.ts";
import { postJson, startService, TestSocket, waitUntil } from "./_http_harness.ts";

/** A JSON-lines request log captured in memory. */
function capture(opts: RequestLogOptions = {}) {
  const lines: string[] = [];
  const log = new RequestLog("json", (line) => lines.push(line), opts);
  return { lines, log, entries: () => lines.map((l) => JSON.parse(l) as RequestLogEntry) };
}

Deno.test("every HTTP request gets one log line: successes, client errors, auth failures, unknown routes and overload", async () => {
  const cap = capture();
  await using svc = await startService(
    { tokenDelayMs: 5, maxRunning: 1, maxWaiting: 0, contextLength: 4096 },
    { requestLog: cap.log, apiKeys: ["sk-test-key"] },
  );
  const auth = { authorization: "Bearer sk-test-key" };
  const ok = await postJson(svc.base + "/v1/completions", {
    prompt: "one two",
    max_tokens: 5,
    seed: 1,
  }, { ...auth, "x-request-id": "client-id-1" });
  assertEquals(ok.status, 200);
  assertEquals(ok.headers.get("x-request-id"), "client-id-1");
  await ok.body?.cancel();
  const bad = await postJson(svc.base + "/v1/completions", { prompt: "x", temperature: 9 }, auth);
  assertEquals(bad.status, 400);
  await bad.body?.cancel();
  const denied = await postJson(svc.base + "/v1/completions", { prompt: "x" });
  assertEquals(denied.status, 401);
  await denied.body?.cancel();
  const missing = await fetch(svc.base + "/nope", { headers: auth });
  assertEquals(missing.status, 404);
  await missing.body?.cancel();
  // Hold the only slot with a stream, then be refused.
  const hold = new AbortController();
  const held = await fetch(svc.base + "/v1/completions", {
    method: "POST",
    headers: { ...auth, "x-request-id": "holder", "content-type": "application/json" },
    body: JSON.stringify({ prompt: "hold", max_tokens: 3000, stream: true }),
    signal: hold.signal,
  });
  const reader = held.body!.getReader();
  await reader.read();
  const refused = await postJson(svc.base + "/v1/completions", { prompt: "me too" }, auth);
  assertEquals(refused.status, 503);
  await refused.body?.cancel();
  hold.abort();
  await reader.cancel().catch(() => {});
  await waitUntil(() => cap.lines.length === 6, "six log lines");

  const byStatus = new Map(cap.entries().map((e) => [e.status, e]));
  const first = cap.entries()[0]!;
  assertEquals(first.request_id, "client-id-1");
  assertEquals([first.method, first.route, first.status], ["POST", "/v1/completions", 200]);
  assertEquals([first.prompt_tokens, first.completion_tokens, first.cached], [
    6, // "one two" in tok512: [1, 353, 411, 259, 424, 414]
    5,
    false,
  ]);
  assert(typeof first.ttft_ms === "number" && first.ttft_ms <= first.total_ms);
  assertEquals(byStatus.get(400)?.code, "invalid_request");
  assertEquals(byStatus.get(401)?.code, "unauthorized");
  // The route label stays bounded ("unmatched"); the line still names the path asked for.
  assertEquals(
    [byStatus.get(404)?.code, byStatus.get(404)?.route, byStatus.get(404)?.path],
    ["not_found", "unmatched", "/nope"],
  );
  assertEquals(byStatus.get(200)?.path, undefined);
  assertEquals(byStatus.get(503)?.code, "overloaded");
  // The streamed one is logged when its stream ends, with the tokens it sent.
  const holder = cap.entries().find((e) => e.request_id === "holder")!;
  assertEquals(holder.status, 200);
  assert((holder.completion_tokens ?? 0) >= 1, JSON.stringify(holder));
  // Every response names its request id, made up when the client sent none.
  for (const e of cap.entries()) assertMatch(e.request_id, /^[\x21-\x7e]{1,128}$/);
});

Deno.test("a response without a client x-request-id carries the generated one, the response id for completions", async () => {
  const cap = capture({ probes: true });
  await using svc = await startService({}, { requestLog: cap.log });
  const res = await postJson(svc.base + "/v1/completions", { prompt: "a b", max_tokens: 2 });
  const body = await res.json();
  assertEquals(res.headers.get("x-request-id"), body.id);
  const health = await fetch(svc.base + "/health");
  await health.body?.cancel();
  assertMatch(health.headers.get("x-request-id") ?? "", /^[0-9a-f]{32}$/);
  await waitUntil(() => cap.lines.length === 2, "two log lines");
  assertEquals(cap.entries()[0]!.request_id, body.id);
});

Deno.test("an x-request-id that is not 1-128 visible ASCII characters is refused with 400 and still logged", async () => {
  const cap = capture();
  await using svc = await startService({}, { requestLog: cap.log });
  const res = await fetch(svc.base + "/health", { headers: { "x-request-id": "x".repeat(129) } });
  assertEquals(res.status, 400);
  const err = (await res.json()).error;
  assertEquals([err.code, err.param], ["invalid_request", "x-request-id"]);
  await waitUntil(() => cap.lines.length === 1, "a log line");
  assertEquals(cap.entries()[0]!.status, 400);
});

Deno.test("WebSocket generations get a line each, refused ones too, ids prefixed by the upgrade's request id", async () => {
  const cap = capture();
  await using svc = await startService({ contextLength: 64 }, { requestLog: cap.log });
  const ws = await TestSocket.open(svc.wsUrl, { "x-request-id": "sock-7" });
  try {
    ws.send({ type: "generate", id: "a", prompt: "the cat", max_tokens: 3 });
    await ws.collect("a");
    ws.send({ type: "generate", id: "b", prompt: "w ".repeat(100), max_tokens: 3 });
    assertEquals((await ws.take((f) => f.id === "b")).code, "context_length_exceeded");
  } finally {
    await ws.close();
  }
  await waitUntil(() => cap.lines.length === 3, "three log lines");
  const [upgrade, a, b] = cap.entries();
  assertEquals([upgrade!.method, upgrade!.route, upgrade!.request_id], [
    "GET",
    "/v1/stream",
    "sock-7",
  ]);
  assertEquals([a!.method, a!.status, a!.completion_tokens, a!.prompt_tokens], [
    "WS",
    200,
    3,
    4, // "the cat" in tok512: [1, 265, 280, 294]
  ]);
  assertMatch(a!.request_id, /^sock-7\.\d+\/a$/);
  assertEquals([b!.status, b!.code], [400, "context_length_exceeded"]);
  assertMatch(b!.request_id, /^sock-7\.\d+\/b$/);
});

Deno.test("the text format puts method, route, status, id, tokens, TTFT and total on one line", () => {
  assertEquals(
    formatText({
      time: "2026-12-01T09:00:00.000Z",
      request_id: "abc",
      method: "POST",
      route: "/v1/completions",
      status: 200,
      prompt_tokens: 5,
      completion_tokens: 16,
      ttft_ms: 3.1,
      total_ms: 40.2,
      cached: false,
    }),
    "2026-12-01T09:00:00.000Z POST /v1/completions 200 id=abc prompt=5 completion=16 ttft=3.1ms total=40.2ms cached=false",
  );
  // No route matched: the line names the path, quoted where it could forge a line.
  const unmatched = {
    time: "t",
    request_id: "abc",
    method: "GET",
    route: "unmatched",
    status: 404,
    total_ms: 1,
  };
  assertEquals(
    formatText({ ...unmatched, path: "/favicon.ico" }),
    "t GET unmatched path=/favicon.ico 404 id=abc total=1ms",
  );
  assertEquals(
    formatText({ ...unmatched, path: "/a\nb" }),
    't GET unmatched path="/a\\nb" 404 id=abc total=1ms',
  );
});

Deno.test("the request id is on the request's llm.request span", async () => {
  const tracer = new RecordingTracer();
  await using backend = new FakeCore();
  const service = createApp({
    backend,
    tracer,
    requestLog: new RequestLog("text", () => {}),
  });
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, service.fetch);
  try {
    const base = `http://127.0.0.1:${(server.addr as Deno.NetAddr).port}`;
    const res = await postJson(base + "/v1/completions", { prompt: "a", max_tokens: 2 }, {
      "x-request-id": "trace-me-42",
    });
    await res.body?.cancel();
    const span = tracer.spans.find((s) => s.name === "llm.request")!;
    assertEquals(span.attributes["llm.request.id"], "trace-me-42");
  } finally {
    service.close();
    await server.shutdown();
    context.disable();
  }
});

Deno.test("--log-format off writes no request lines", async () => {
  const lines: string[] = [];
  await using svc = await startService({}, {
    requestLog: new RequestLog("off", (l) => lines.push(l)),
  });
  const res = await postJson(svc.base + "/v1/completions", { prompt: "a", max_tokens: 1 });
  assertEquals(res.status, 200);
  // The id is still made and echoed.
  assert(res.headers.get("x-request-id") !== null);
  await res.body?.cancel();
  const health = await fetch(svc.base + "/health");
  await health.body?.cancel();
  assertEquals(lines, []);
});

Deno.test("RequestLog leaves successful probes out unless asked, and --log-level filters by status", () => {
  const entry = (route: string, status: number, method = "GET"): RequestLogEntry => ({
    time: "t",
    request_id: "r",
    method,
    route,
    status,
    total_ms: 1,
  });
  const sent = [
    entry("/health", 200),
    entry("/ready", 503),
    entry("/metrics", 200),
    entry("/metrics", 401),
    entry("/v1/completions", 200, "POST"),
    entry("/v1/completions", 400, "POST"),
    entry("/v1/completions", 503, "POST"),
  ];
  const written = (opts: RequestLogOptions) => {
    const c = capture(opts);
    for (const e of sent) c.log.write(e);
    return c.entries().map((e) => `${e.route} ${e.status}`);
  };
  // Default (info, no probes): every request but the probes that succeeded.
  assertEquals(written({}), [
    "/ready 503",
    "/metrics 401",
    "/v1/completions 200",
    "/v1/completions 400",
    "/v1/completions 503",
  ]);
  assertEquals(written({ probes: true }), sent.map((e) => `${e.route} ${e.status}`));
  assertEquals(written({ level: "debug" }), sent.map((e) => `${e.route} ${e.status}`));
  assertEquals(written({ level: "warn", probes: true }), ["/ready 503", "/v1/completions 503"]);
  assertEquals(written({ level: "error" }), []);
});

Deno.test("formatText() quotes an id that could forge a line or carry terminal escapes", () => {
  const entry = (id: string): RequestLogEntry => ({
    time: "2026-12-01T09:00:00.000Z",
    request_id: id,
    method: "WS",
    route: "/v1/stream",
    status: 200,
    total_ms: 1,
  });
  for (const id of ["a\n2026-12-01T09:00:01.000Z POST /admin 200", "\u001b[31mred", "a b", 'q"x']) {
    const line = formatText(entry(id));
    assertEquals(line.includes("\n"), false, line);
    assertEquals(line.includes("\u001b"), false, line);
    assertMatch(line, /id="/);
    // The id survives, as JSON.
    assertEquals(JSON.parse(/ id=(".*") total=/.exec(line)![1]!), id);
  }
  assertMatch(formatText(entry("sock-7.1/a")), / id=sock-7\.1\/a /);
});
