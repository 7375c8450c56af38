import { assert, assertEquals, assertGreater, assertMatch } from "@std/assert";
import { DRAINED_MESSAGE, DRAINING_MESSAGE } from "../lib/core/draining.ts";
import { FakeCore } from "./_fake_core.ts";
import type { GenerationEvent, GenerationRequest } from "../lib/core/generation.ts";
import {
  assertRefusesInvalidUtf8,
  invalidUtf8Completion,
  metricValue,
  parseSse,
  postJson,
  scrape,
  startService,
  type TestService,
  TestSocket,
  waitUntil,
} from "./_http_harness.ts";

/** The fake model's text for the prompt alone, under the sampling the core was asked for. */
function expectedText(svc: TestService, prompt: string, n: number, request = 0): string {
  return svc.backend.continuation(prompt, n, svc.backend.requests[request]!.sampling).text;
}

Deno.test("POST /v1/completions returns the core's text, usage and timings", async () => {
  await using svc = await startService();
  const res = await postJson(svc.base + "/v1/completions", {
    model: "fake-llama",
    prompt: "Once upon a time",
    max_tokens: 7,
    seed: 11,
    temperature: 0.7,
    top_p: 0.8,
    top_k: 20,
    min_p: 0.1,
    logprobs: 0,
    user: "ignored",
  });
  assertEquals(res.status, 200);
  const body = await res.json();
  assertEquals(res.headers.get("x-request-id"), body.id);
  assertMatch(body.id, /^cmpl-[0-9a-f]{32}$/);
  assertEquals(body.object, "text_completion");
  assertEquals(body.model, "fake-llama");
  assertEquals(body.choices[0].text, expectedText(svc, "Once upon a time", 7));
  assertEquals(body.choices[0].finish_reason, "length");
  assertEquals(body.choices[0].logprobs.tokens.join(""), body.choices[0].text);
  assertEquals(body.choices[0].logprobs.token_logprobs.length, 7);
  // "Once upon a time" is 5 tokens with BOS: 1, 403, 407, 261, 378 (../shared/models/README.md).
  const p = 5;
  assertEquals(body.usage, {
    prompt_tokens: p,
    completion_tokens: 7,
    total_tokens: p + 7,
    prompt_tokens_details: { cached_tokens: 0 },
  });
  assertGreater(body.timings.total_ms, 0);
  const req = svc.backend.requests[0]!;
  assertEquals(req.sampling, { temperature: 0.7, topK: 20, topP: 0.8, minP: 0.1, seed: 11 });
  assertEquals(req.requestId, body.id);
  // OpenAI's default of 16 tokens when max_tokens is absent.
  const dflt = await (await postJson(svc.base + "/v1/completions", { prompt: "x" })).json();
  assertEquals(dflt.usage.completion_tokens, 16);
  // Token-id prompts go to the core as ids.
  const ids =
    await (await postJson(svc.base + "/v1/completions", { prompt: [[1, 403, 407]], max_tokens: 2 }))
      .json();
  assertEquals(ids.usage.prompt_tokens, 3);
  assertEquals(svc.backend.requests.at(-1)!.prompt, [1, 403, 407]);
});

Deno.test("a body that is not UTF-8 gets a 400 from a server of one model, sent whole or chunked, and nothing is generated", async () => {
  await using svc = await startService();
  const { body, ...init } = invalidUtf8Completion("fake-llama");
  await assertRefusesInvalidUtf8(await fetch(svc.base + "/v1/completions", { ...init, body }));
  // Without Content-Length the body limit buffers it first (hono/body-limit): the same answer.
  const chunked = ReadableStream.from([body as Uint8Array]);
  await assertRefusesInvalidUtf8(
    await fetch(svc.base + "/v1/completions", { ...init, body: chunked }),
  );
  assertEquals(svc.backend.requests.length, 0);
});

Deno.test("a chunked body (no Content-Length) under the limit is served as a whole one is", async () => {
  await using svc = await startService();
  const json = JSON.stringify({ prompt: "Once upon a time", max_tokens: 5, seed: 3 });
  const enc = new TextEncoder();
  const res = await fetch(svc.base + "/v1/completions", {
    method: "POST",
    headers: { "content-type": "application/json" },
    // Split inside a field: the body limit buffers the pieces before the route reads them.
    body: ReadableStream.from([enc.encode(json.slice(0, 12)), enc.encode(json.slice(12))]),
  });
  const body = await res.json();
  assertEquals(res.status, 200, JSON.stringify(body));
  assertEquals(body.choices[0].text, expectedText(svc, "Once upon a time", 5));
  assertEquals(res.headers.get("x-request-id"), body.id);
});

Deno.test("POST /v1/completions with stream:true sends SSE chunks, usage, then [DONE]", async () => {
  await using svc = await startService({ tokenDelayMs: 2 });
  const res = await postJson(svc.base + "/v1/completions", {
    prompt: "a b c",
    max_tokens: 5,
    seed: 4,
    stream: true,
    stream_options: { include_usage: true },
  });
  assertEquals(res.status, 200);
  assertEquals(res.headers.get("content-type"), "text/event-stream; charset=utf-8");
  const events = parseSse(await res.text()) as Array<Record<string, any>>;
  assertEquals(events.at(-1), "[DONE]");
  const chunks = events.slice(0, -1);
  const usage = chunks.at(-1)!;
  assertEquals(usage.choices, []);
  assertEquals(usage.usage.completion_tokens, 5);
  const withChoices = chunks.slice(0, -1);
  assert(withChoices.every((c) => c.object === "text_completion" && c.usage === null));
  assertEquals(withChoices.map((c) => c.choices[0].text).join(""), expectedText(svc, "a b c", 5));
  assertEquals(withChoices.at(-1)!.choices[0].finish_reason, "length");
  assert(withChoices.slice(0, -1).every((c) => c.choices[0].finish_reason === null));
  assertEquals(new Set(chunks.map((c) => c.id)).size, 1);
});

Deno.test("POST /v1/chat/completions uses the plain chat format without a template", async () => {
  await using svc = await startService();
  const res = await postJson(svc.base + "/v1/chat/completions", {
    model: "fake-llama",
    messages: [
      { role: "system", content: "You are terse." },
      { role: "user", content: [{ type: "text", text: "Hi " }, { type: "text", text: "there" }] },
      { role: "assistant", content: "Hello." },
      { role: "user", content: "Story?" },
    ],
    max_completion_tokens: 6,
    seed: 9,
    stop: "\n\n",
    logprobs: true,
  });
  assertEquals(res.status, 200);
  const body = await res.json();
  const prompt =
    "System: You are terse.\nUser: Hi there\nAssistant: Hello.\nUser: Story?\nAssistant:";
  const req = svc.backend.requests[0]!;
  assertEquals(req.prompt, svc.backend.tokenize(prompt, { bos: true, special: false }));
  assertEquals(req.stop, ["\n\n", "\nUser:", "\nSystem:"]);
  assertEquals(body.object, "chat.completion");
  assertEquals(body.choices[0].message, {
    role: "assistant",
    content: expectedText(svc, prompt, 6),
    refusal: null,
  });
  assertEquals(body.choices[0].logprobs.content.length, 6);
  // tok512 (run.c's encoding): BOS and 55 pieces.
  assertEquals(body.usage.prompt_tokens, 56);
});

Deno.test("POST /v1/chat/completions renders the model's Jinja chat template", async () => {
  // Zephyr's template (TinyLlama-1.1B-Chat), as stored in tokenizer.chat_template.
  const zephyr = "{% for message in messages %}\n{% if message['role'] == 'user' %}\n" +
    "{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n" +
    "{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n" +
    "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n" +
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";
  await using svc = await startService({ chatTemplate: zephyr });
  const res = await postJson(svc.base + "/v1/chat/completions", {
    messages: [{ role: "system", content: "Be kind." }, { role: "user", content: "Hi" }],
    max_tokens: 2,
  });
  assertEquals(res.status, 200);
  await res.body?.cancel();
  // Rendered by hand from the template: each block emits its text then a newline. tok512's
  // EOS piece is "\n</s>\n" (llama2.c's export).
  const eos = "\n</s>\n";
  assertEquals(
    svc.backend.requests[0]!.prompt,
    svc.backend.tokenize(`<|system|>\nBe kind.${eos}\n<|user|>\nHi${eos}\n<|assistant|>\n`, {
      bos: true,
      special: true,
    }),
  );
  assertEquals(svc.backend.requests[0]!.stop, []);
});

Deno.test("POST /v1/chat/completions stream:true sends role, deltas, finish, usage, [DONE]", async () => {
  await using svc = await startService({ tokenDelayMs: 2 });
  const res = await postJson(svc.base + "/v1/chat/completions", {
    messages: [{ role: "user", content: "Hello" }],
    max_tokens: 4,
    seed: 1,
    stream: true,
  });
  const events = parseSse(await res.text()) as Array<Record<string, any>>;
  assertEquals(events.at(-1), "[DONE]");
  const chunks = events.slice(0, -1);
  assertEquals(chunks[0]!.choices[0].delta, { role: "assistant", content: "" });
  const text = chunks.map((c) => c.choices[0].delta.content ?? "").join("");
  assertEquals(text, expectedText(svc, "User: Hello\nAssistant:", 4));
  assertEquals(chunks.at(-1)!.choices[0], {
    index: 0,
    delta: {},
    finish_reason: "length",
    logprobs: null,
  });
  // Without stream_options.include_usage there is no usage chunk and no usage field.
  assert(chunks.every((c) => !("usage" in c)));
});

Deno.test("every request error answers with its status, code, field and received value", async () => {
  await using svc = await startService({ contextLength: 64 }, { maxBodyBytes: 4096 });
  const chat = svc.base + "/v1/chat/completions";
  const comp = svc.base + "/v1/completions";
  const msgs = [{ role: "user", content: "hi" }];
  const cases: Array<{
    name: string;
    url: string;
    body?: unknown;
    status: number;
    code: string;
    param: string | null;
    type: string;
    message: RegExp;
  }> = [
    {
      name: "invalid JSON",
      url: chat,
      body: "{oops",
      status: 400,
      code: "invalid_json",
      param: null,
      type: "invalid_request_error",
      message: /not valid JSON/,
    },
    {
      name: "empty body",
      url: chat,
      body: "",
      status: 400,
      code: "invalid_json",
      param: null,
      type: "invalid_request_error",
      message: /empty/,
    },
    {
      name: "temperature type",
      url: chat,
      body: { messages: msgs, temperature: "hot" },
      status: 400,
      code: "invalid_request",
      param: "temperature",
      type: "invalid_request_error",
      message: /'temperature': expected number, received string; got "hot"/,
    },
    {
      name: "temperature range",
      url: comp,
      body: { prompt: "x", temperature: 5 },
      status: 400,
      code: "invalid_request",
      param: "temperature",
      type: "invalid_request_error",
      message: /<=2; got 5/,
    },
    {
      name: "missing messages",
      url: chat,
      body: { model: "fake-llama" },
      status: 400,
      code: "invalid_request",
      param: "messages",
      type: "invalid_request_error",
      message: /^Missing required field 'messages' \(expected array\)$/,
    },
    {
      name: "bad role",
      url: chat,
      body: { messages: [{ role: "robot", content: "x" }] },
      status: 400,
      code: "invalid_request",
      param: "messages[0].role",
      type: "invalid_request_error",
      message: /expected one of "system", "developer", "user", "assistant", "tool"; got "robot"/,
    },
    {
      name: "n > 16",
      url: chat,
      body: { messages: msgs, n: 17 },
      status: 400,
      code: "invalid_request",
      param: "n",
      type: "invalid_request_error",
      message: /<=16; got 17/,
    },
    {
      // OpenAI's limit on alternatives per token.
      name: "completion logprobs > 20",
      url: comp,
      body: { prompt: "a", logprobs: 21 },
      status: 400,
      code: "invalid_request",
      param: "logprobs",
      type: "invalid_request_error",
      message: /<=20; got 21/,
    },
    {
      name: "batched prompts",
      url: comp,
      body: { prompt: ["a", "b"] },
      status: 400,
      code: "invalid_request",
      param: "prompt",
      type: "invalid_request_error",
      message: /batched prompts are not supported/,
    },
    {
      name: "max_tokens 0",
      url: comp,
      body: { prompt: "a", max_tokens: 0 },
      status: 400,
      code: "invalid_request",
      param: "max_tokens",
      type: "invalid_request_error",
      message: />=1; got 0/,
    },
    {
      name: "wrong model",
      url: chat,
      body: { model: "gpt-4", messages: msgs },
      status: 404,
      code: "model_not_found",
      param: "model",
      type: "not_found_error",
      message: /"gpt-4" does not exist; this server serves "fake-llama"/,
    },
    {
      name: "prompt too long",
      url: comp,
      body: { prompt: "w ".repeat(80) },
      status: 400,
      code: "context_length_exceeded",
      param: "prompt",
      type: "invalid_request_error",
      // tok512 spells "w " as one token, the trailing space as another, plus BOS.
      message: /prompt is 82 tokens but the model's context is 64 tokens/,
    },
    {
      name: "chat too long",
      url: chat,
      body: { messages: [{ role: "user", content: "w ".repeat(80) }] },
      status: 400,
      code: "context_length_exceeded",
      param: "messages",
      type: "invalid_request_error",
      message: /is 9\d tokens .* 64 tokens/,
    },
    {
      name: "body too large",
      url: comp,
      body: { prompt: "x".repeat(5000) },
      status: 413,
      code: "payload_too_large",
      param: null,
      type: "invalid_request_error",
      message: /the limit is 4096 bytes/,
    },
    {
      name: "unknown route",
      url: svc.base + "/v2/nothing",
      body: {},
      status: 404,
      code: "not_found",
      param: null,
      type: "not_found_error",
      message: /No route for POST \/v2\/nothing/,
    },
  ];
  for (const c of cases) {
    const res = await postJson(c.url, c.body);
    const got = await res.json();
    assertEquals(res.status, c.status, c.name);
    assertEquals(got.error.code, c.code, c.name);
    assertEquals(got.error.param, c.param, c.name);
    assertEquals(got.error.type, c.type, c.name);
    assertMatch(got.error.message, c.message, c.name);
  }
  // A chunked body (no Content-Length) is cut off at the limit too.
  const chunked = await fetch(comp, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: new ReadableStream({
      start(ctrl) {
        for (let i = 0; i < 10; i++) ctrl.enqueue(new TextEncoder().encode("x".repeat(1000)));
        ctrl.close();
      },
    }),
  });
  assertEquals(chunked.status, 413);
  assertMatch((await chunked.json()).error.message, /more than 4096 bytes/);
  const get = await fetch(svc.base + "/v1/stream");
  assertEquals(get.status, 426);
  assertEquals((await get.json()).error.code, "upgrade_required");
  assertEquals(svc.backend.requests.length, 0, "an invalid request reached the core");
  const m = await scrape(svc.base);
  assertEquals(metricValue(m, 'llm_errors_total{code="invalid_request"}'), 8);
  assertEquals(
    metricValue(
      m,
      'llm_http_requests_total{method="POST",route="/v1/chat/completions",status="400"}',
    ),
    7,
  );
});

Deno.test("max_tokens beyond the context is capped to what the context has left", async () => {
  await using svc = await startService({ contextLength: 40 });
  const body = await (await postJson(svc.base + "/v1/completions", {
    prompt: "one two three",
    max_tokens: 5000,
  }))
    .json();
  const room = 40 - svc.backend.countTokens("one two three");
  assertEquals(svc.backend.requests[0]!.maxTokens, room);
  assertEquals(body.usage.completion_tokens, room);
  assertEquals(body.choices[0].finish_reason, "length");
});

Deno.test("a full queue answers 503 overloaded with Retry-After, streaming or not", async () => {
  await using svc = await startService(
    { tokenDelayMs: 10, maxRunning: 1, maxWaiting: 0, contextLength: 4096 },
    { retryAfterSeconds: 7 },
  );
  const holder = new AbortController();
  const first = await fetch(svc.base + "/v1/completions", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: "hold", max_tokens: 3000, stream: true }),
    signal: holder.signal,
  });
  const reader = first.body!.getReader();
  await reader.read();
  for (const stream of [false, true]) {
    const res = await postJson(svc.base + "/v1/chat/completions", {
      messages: [{ role: "user", content: "me too" }],
      stream,
    });
    assertEquals(res.status, 503);
    assertEquals(res.headers.get("retry-after"), "7");
    const err = (await res.json()).error;
    assertEquals([err.code, err.type], ["overloaded", "service_unavailable_error"]);
    assertMatch(err.message, /the limit is 0/);
  }
  holder.abort();
  await reader.cancel().catch(() => {});
  await waitUntil(() => svc.backend.active === 0, "the held generation to be released");
});

Deno.test("a client that disconnects aborts its HTTP generation, streaming or not", async () => {
  await using svc = await startService({ tokenDelayMs: 5, contextLength: 1 << 20, kvBlockSize: 4 });
  // Streaming: read two chunks, then go away.
  const ctrl = new AbortController();
  const res = await fetch(svc.base + "/v1/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      messages: [{ role: "user", content: "go" }],
      max_tokens: 100000,
      stream: true,
    }),
    signal: ctrl.signal,
  });
  const reader = res.body!.getReader();
  await reader.read();
  await reader.read();
  assertEquals(svc.backend.active, 1);
  ctrl.abort();
  await reader.cancel().catch(() => {});
  await waitUntil(() => svc.backend.active === 0, "the streaming generation to be aborted");
  // Non-streaming: the response never comes; the server notices the closed connection.
  const ctrl2 = new AbortController();
  const pending = fetch(svc.base + "/v1/completions", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: "go", max_tokens: 100000 }),
    signal: ctrl2.signal,
  }).catch((e) => e);
  await waitUntil(() => svc.backend.active === 1, "the second generation to start");
  await waitUntil(() => svc.backend.tokensYielded > 5, "some tokens");
  ctrl2.abort();
  await pending;
  await waitUntil(() => svc.backend.active === 0, "the non-streaming generation to be aborted");
  const m = await scrape(svc.base);
  assertEquals(metricValue(m, "llm_kv_blocks_used"), 0);
  assertEquals(metricValue(m, "llm_inflight_generations"), 0);
  assertEquals(
    (metricValue(m, 'llm_generations_total{api="chat_completions",finish_reason="cancelled"}') ??
      0) +
      (metricValue(m, 'llm_generations_total{api="completions",finish_reason="cancelled"}') ?? 0),
    2,
  );
});

Deno.test("an executor error mid-stream ends the SSE stream with an error event", async () => {
  await using svc = await startService({ tokenDelayMs: 1, failMarker: "BOOM" });
  const res = await postJson(svc.base + "/v1/completions", {
    prompt: "BOOM now",
    max_tokens: 10,
    stream: true,
  });
  assertEquals(res.status, 200);
  const events = parseSse(await res.text()) as Array<Record<string, any>>;
  const last = events.at(-1)!;
  assertEquals(last.error.code, "internal");
  assertMatch(last.error.message, /the engine crashed in 4 steps that included this request/);
  assertEquals(events.filter((e) => e.choices !== undefined).length, 2);
  assert(!(events as unknown[]).includes("[DONE]"));
  // Non-streaming: the same failure is a 500.
  const res2 = await postJson(svc.base + "/v1/completions", {
    prompt: "BOOM again",
    max_tokens: 10,
  });
  assertEquals(res2.status, 500);
  assertEquals((await res2.json()).error.type, "server_error");
});

Deno.test("API keys: /v1 and /metrics need a valid bearer token, /health stays open", async () => {
  await using svc = await startService({}, { apiKeys: ["key-one", "key-two"] });
  const open = await fetch(svc.base + "/health");
  assertEquals([open.status, await open.json()], [200, { status: "ok", phase: "ready" }]);
  for (
    const [headers, status, message] of [
      [{}, 401, /Missing API key/],
      [{ authorization: "Bearer key-on" }, 401, /Invalid API key/],
      [
        { authorization: "Basic a2V5LW9uZQ==" },
        401,
        /scheme "Basic"; expected 'Authorization: Bearer <key>'/,
      ],
      [
        { authorization: "Bearer key-one extra" },
        401,
        /2 words after 'Bearer'; expected exactly one/,
      ],
      [{ authorization: "Bearer" }, 401, /0 words after 'Bearer'/],
    ] as const
  ) {
    const res = await postJson(
      svc.base + "/v1/completions",
      { prompt: "x", max_tokens: 1 },
      headers,
    );
    assertEquals(res.status, status);
    assertEquals(res.headers.get("www-authenticate"), 'Bearer realm="llmserve"');
    const err = (await res.json()).error;
    assertEquals([err.code, err.type], ["unauthorized", "authentication_error"]);
    assertMatch(err.message, message);
  }
  const metricsRes = await fetch(svc.base + "/metrics");
  assertEquals(metricsRes.status, 401);
  await metricsRes.body?.cancel();
  for (const key of ["key-one", "key-two"]) {
    const ok = await postJson(svc.base + "/v1/completions", { prompt: "x", max_tokens: 1 }, {
      authorization: `Bearer ${key}`,
    });
    assertEquals(ok.status, 200);
    await ok.body?.cancel();
  }
  assertEquals(svc.backend.requests.length, 2);
});

Deno.test("GET /ready reports loading, a dead executor and draining; /v1/models lists the model", async () => {
  await using svc = await startService({ tokenDelayMs: 5 }, { ready: false });
  const get = async (path: string) => {
    const r = await fetch(svc.base + path);
    return [r.status, await r.json()];
  };
  assertEquals(await get("/ready"), [503, {
    status: "unavailable",
    reasons: ["model not loaded"],
  }]);
  svc.service.setReady(true);
  assertEquals(await get("/ready"), [200, { status: "ready" }]);
  const [status, models] = await get("/v1/models");
  assertEquals(status, 200);
  assertEquals(models.object, "list");
  assertEquals(models.data.map((m: { id: string }) => m.id), ["fake-llama"]);
  assertEquals((await get("/v1/models/fake-llama"))[0], 200);
  assertEquals((await get("/v1/models/other"))[0], 404);
  // The engine dies and cannot be rebuilt: the request fails, and the core reports it down.
  svc.backend.breakEngine();
  const failed = await postJson(svc.base + "/v1/completions", { prompt: "x", max_tokens: 2 });
  assertEquals(failed.status, 500);
  await failed.body?.cancel();
  assertEquals(await get("/ready"), [503, {
    status: "unavailable",
    reasons: ["executor unhealthy"],
  }]);
});

Deno.test("drain(): /ready 503, new requests 503 draining, in-flight requests finish", async () => {
  await using svc = await startService({ tokenDelayMs: 5 });
  const inflight = await postJson(svc.base + "/v1/completions", {
    prompt: "keep going",
    max_tokens: 20,
    seed: 3,
    stream: true,
  });
  const reader = inflight.body!.getReader();
  await reader.read();
  const drained = svc.service.drain({ timeoutMs: 5000 });
  assert(svc.service.draining);
  const ready = await fetch(svc.base + "/ready");
  assertEquals([ready.status, (await ready.json()).reasons], [503, ["draining"]]);
  const refused = await postJson(svc.base + "/v1/completions", { prompt: "new" });
  assertEquals(refused.status, 503);
  assertEquals(refused.headers.get("retry-after"), "1");
  const refusal = (await refused.json()).error;
  assertEquals([refusal.code, refusal.message], ["draining", DRAINING_MESSAGE]);
  let rest = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    rest += new TextDecoder().decode(value);
  }
  const events = parseSse(rest) as Array<Record<string, any>>;
  assertEquals(events.at(-1), "[DONE]");
  assertEquals(events.at(-2)!.choices[0].finish_reason, "length");
  assertEquals(await drained, { completed: true, aborted: 0 });
  assertEquals((await fetch(svc.base + "/health")).status, 200);
});

Deno.test("drain() aborts generations still running at its deadline", async () => {
  await using svc = await startService({ tokenDelayMs: 5, contextLength: 1 << 20 });
  const res = await postJson(svc.base + "/v1/completions", {
    prompt: "forever",
    max_tokens: 100000,
    stream: true,
  });
  const t0 = performance.now();
  const result = await svc.service.drain({ timeoutMs: 100 });
  const took = performance.now() - t0;
  assertEquals(result, { completed: false, aborted: 1 });
  // The deadline ended it (the generation alone would run for minutes: 100000 tokens at 5 ms):
  // the result says one was aborted, and the drain waited its 100 ms first.
  assertGreater(took, 90);
  const events = parseSse(await res.text()) as Array<Record<string, any>>;
  // "cancelled" is no OpenAI finish reason: a stream the server cut ends with an error event.
  assertEquals(events.at(-1)!.error, {
    ...events.at(-1)!.error,
    code: "draining",
    message: DRAINED_MESSAGE,
  });
  assert(events.every((e) => e.choices?.[0]?.finish_reason !== "cancelled"));
  assertEquals(svc.backend.active, 0);
});

Deno.test("drain() answers a non-streaming generation cut off at its deadline with 503 draining", async () => {
  await using svc = await startService({ tokenDelayMs: 5, contextLength: 1 << 20 });
  const pending = postJson(svc.base + "/v1/completions", { prompt: "forever", max_tokens: 100000 });
  while (svc.backend.active === 0) await new Promise((r) => setTimeout(r, 5));
  assertEquals(await svc.service.drain({ timeoutMs: 100 }), { completed: false, aborted: 1 });
  const res = await pending;
  // A 200 with truncated text would pass for a finished answer; 503 tells the client to retry.
  assertEquals(res.status, 503);
  assertEquals(res.headers.get("retry-after"), "1");
  assertEquals((await res.json()).error.code, "draining");
  assertEquals(svc.backend.active, 0);
});

Deno.test("a core that throws is answered as an internal error, and nothing stays in flight", async () => {
  class ThrowingBackend extends FakeCore {
    override generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent> {
      if (this.detokenize(req.prompt) === "sync") throw new Error("scheduler exploded");
      const inner = super.generate(req, signal);
      return (async function* () {
        for await (const ev of inner) {
          if (ev.type === "token") throw new Error("executor exploded");
          yield ev;
        }
      })();
    }
  }
  await using svc = await startService(new ThrowingBackend());
  const sync = await postJson(svc.base + "/v1/completions", { prompt: "sync" });
  assertEquals(sync.status, 500);
  assertEquals((await sync.json()).error, {
    message: "scheduler exploded",
    type: "server_error",
    param: null,
    code: "internal",
  });
  const late = await postJson(svc.base + "/v1/completions", { prompt: "late", stream: true });
  const events = parseSse(await late.text()) as Array<Record<string, any>>;
  assertEquals(events.at(-1)!.error.message, "executor exploded");
  assertEquals(svc.service.inFlight, 0);
  const m = await scrape(svc.base);
  assertEquals(metricValue(m, 'llm_generations_total{api="completions",finish_reason="error"}'), 2);
  assertEquals(metricValue(m, 'llm_errors_total{code="internal"}'), 2);
});

Deno.test("max_tokens beyond the context's room is lowered to fit, and the response and frames say so", async () => {
  await using svc = await startService({ contextLength: 32 });
  // tok512 spells "one two three" in 9 tokens with BOS: 23 positions are left.
  for (const [asked, capped, n] of [[100, true, 23], [5, false, 5]] as const) {
    const res = await postJson(svc.base + "/v1/completions", {
      prompt: "one two three",
      max_tokens: asked,
      seed: 1,
    });
    const body = await res.json();
    assertEquals([body.max_tokens_capped, body.usage.completion_tokens], [capped, n]);
    assertEquals(body.choices[0].finish_reason, "length");
  }
  const stream = await postJson(svc.base + "/v1/chat/completions", {
    messages: [{ role: "user", content: "hi" }],
    max_tokens: 1000,
    stream: true,
  });
  const chunks = parseSse(await stream.text()) as Array<Record<string, unknown>>;
  assertEquals(chunks.at(-2)!.max_tokens_capped, true);
  const ws = await TestSocket.open(svc.wsUrl);
  try {
    ws.send({ type: "generate", id: "c", prompt: "one two three", max_tokens: 50 });
    const frames = await ws.collect("c");
    assertEquals([frames[0]!.max_tokens, frames[0]!.max_tokens_capped], [23, true]);
    assertEquals(frames.at(-1)!.max_tokens_capped, true);
  } finally {
    await ws.close();
  }
});

Deno.test("a burst that fits the free running slots is served, not refused as overloaded (issue 13, bug 4)", async () => {
  // 40 at once with 64 running slots free and room for 8 more to wait: none of them is queued
  // beyond what can start at the next step, so none may get 503.
  await using svc = await startService({
    tokenDelayMs: 5,
    maxRunning: 64,
    maxWaiting: 8,
    kvBlocksTotal: 1024,
  });
  const answers = await Promise.all(
    Array.from(
      { length: 40 },
      (_, i) =>
        postJson(svc.base + "/v1/completions", { prompt: `burst ${i}`, max_tokens: 4, seed: i })
          .then(async (r) => [r.status, await r.json()] as const),
    ),
  );
  const statuses = answers.map(([s]) => s);
  assertEquals(statuses.filter((s) => s !== 200), [], `statuses: ${statuses.join(",")}`);
  for (const [, body] of answers) assertEquals(body.usage.completion_tokens, 4);
});

Deno.test("an SSE client that stops reading is cut after the stall timeout and its generation freed", async () => {
  const tokenBytes = 65536;
  await using svc = await startService(
    { tokenDelayMs: 0, tokenPadding: tokenBytes, contextLength: 1 << 30, maxRunning: 1 },
    { wsStallTimeoutMs: 1500 },
  );
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: Number(new URL(svc.base).port) });
  try {
    const body = JSON.stringify({ prompt: "p", max_tokens: 1_000_000, stream: true });
    await conn.write(new TextEncoder().encode(
      `POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${body.length}\r\n\r\n${body}`,
    ));
    await waitUntil(() => svc.backend.tokensYielded > 0, "generation to start");
    // The client reads nothing: its stream is cut and the core's only running slot freed.
    await waitUntil(() => svc.backend.active === 0, "the stalled stream to be cut", 8000);
    const res = await postJson(svc.base + "/v1/completions", { prompt: "next", max_tokens: 3 });
    assertEquals(res.status, 200);
    assertEquals((await res.json()).choices[0].finish_reason, "length");
    assertEquals(metricValue(await scrape(svc.base), 'llm_errors_total{code="too_slow"}'), 1);
  } finally {
    conn.close();
  }
});
