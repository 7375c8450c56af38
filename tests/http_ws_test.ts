import { assert, assertEquals, assertGreater, assertLess, assertMatch } from "@std/assert";
import { DRAINING_MESSAGE } from "../lib/core/draining.ts";
import {
  metricValue,
  rawHttp,
  scrape,
  startService,
  type TestService,
  TestSocket,
  waitUntil,
} from "./_http_harness.ts";
import { RawWebSocket } from "./_raw_ws_client.ts";
import type { SamplingParams } from "../lib/engine/engine.ts";
import type { GenerationBackend, GenerationEvent } from "../lib/core/generation.ts";
import { createApp } from "../lib/http/app.ts";
import { RequestLog } from "../lib/http/request_log.ts";
import { serveService } from "../lib/http/serve.ts";
import { FakeCore } from "./_fake_core.ts";

/** What the fake model generates for a prompt alone: the oracle for the text that must arrive. */
function expectedText(svc: TestService, prompt: string, sampling: SamplingParams, n: number) {
  return svc.backend.continuation(prompt, n, sampling).text;
}

function textOf(frames: Array<Record<string, unknown>>): string {
  return frames.filter((f) => f.type === "token").map((f) => f.text as string).join("");
}

Deno.test("/v1/stream multiplexes two concurrent generations on one socket by id", async () => {
  await using svc = await startService({ tokenDelayMs: 5 });
  const ws = await TestSocket.open(svc.wsUrl);
  try {
    ws.send({ type: "generate", id: "a", prompt: "the cat sat", max_tokens: 12, seed: 7 });
    ws.send({
      type: "generate",
      id: "b",
      prompt: "a dog ran far away",
      max_tokens: 9,
      seed: 3,
      temperature: 0.5,
      top_k: 40,
      top_p: 0.9,
      min_p: 0.05,
      stop: ["zzz"],
      priority: "batch",
      logprobs: true,
    });
    const order: string[] = [];
    const seen = {
      a: [] as Array<Record<string, unknown>>,
      b: [] as Array<Record<string, unknown>>,
    };
    while (!["a", "b"].every((id) => seen[id as "a"].some((f) => f.type === "done"))) {
      const f = await ws.take();
      order.push(`${f.id}:${f.type}`);
      seen[f.id as "a" | "b"].push(f);
    }
    for (
      // count: the prompt's tokens in tok512 (run.c's encoding), BOS included:
      // "the cat sat" [1, 265, 280, 294, 262, 294],
      // "a dog ran far away" [1, 261, 400, 428, 352, 303, 272, 295, 261, 424, 283].
      const [id, prompt, seed, n, count] of [["a", "the cat sat", 7, 12, 6], [
        "b",
        "a dog ran far away",
        3,
        9,
        11,
      ]] as const
    ) {
      const frames = seen[id];
      const sampling = svc.backend.requests.find((r) => r.requestId.endsWith(`/${id}`))!.sampling;
      assertEquals(sampling.seed, seed);
      assertEquals(frames[0], {
        type: "started",
        id,
        prompt_tokens: count,
        max_tokens: n,
        max_tokens_capped: false,
      });
      assertEquals(textOf(frames), expectedText(svc, prompt, sampling, n));
      const done = frames.at(-1)!;
      assertEquals(done.finish_reason, "length");
      assertEquals(done.usage, {
        prompt_tokens: count,
        completion_tokens: n,
        total_tokens: count + n,
        // b (batch) starts after a's prompt is in the cache and shares its first token, BOS:
        // the prefix cache reuses to the token.
        cached_tokens: id === "b" ? 1 : 0,
      });
      const timings = done.timings as Record<string, number>;
      assertGreater(timings.total_ms, 0);
    }
    // Logprobs only where asked for.
    assert(seen.b.filter((f) => f.type === "token").every((f) => typeof f.logprob === "number"));
    assert(seen.a.filter((f) => f.type === "token").every((f) => !("logprob" in f)));
    // Interleaved: b produced tokens before a finished.
    assertLess(order.indexOf("b:token"), order.indexOf("a:done"));
    // The frame fields reached the core as sampling parameters.
    const reqB = svc.backend.requests.find((r) => r.requestId.endsWith("/b"))!;
    assertEquals(reqB.sampling, { temperature: 0.5, topK: 40, topP: 0.9, minP: 0.05, seed: 3 });
    assertEquals(reqB.stop, ["zzz"]);
    assertEquals(reqB.priority, "batch");
    assertEquals(reqB.logprobs, true);
  } finally {
    await ws.close();
  }
});

/**
 * `core` as a backend that ends a cancelled generation without its final event. Backends owe
 * one (the serving core, the router and the result cache all send it); the session covers
 * for one that does not.
 */
function silentOnCancel(core: FakeCore): GenerationBackend {
  return new Proxy(core, {
    get(target, key) {
      if (key === "generate") {
        return async function* (...args: Parameters<FakeCore["generate"]>) {
          for await (const ev of target.generate(...args) as AsyncIterable<GenerationEvent>) {
            if (ev.type === "done" && args[1].aborted) return;
            yield ev;
          }
        };
      }
      const v = Reflect.get(target, key);
      return typeof v === "function" ? v.bind(target) : v;
    },
  });
}

Deno.test("/v1/stream: a generation cancelled without the backend's final event still ends with done, counting the prompt it read", async () => {
  const core = new FakeCore({ tokenDelayMs: 10, contextLength: 4096 });
  const service = createApp({
    backend: silentOnCancel(core),
    requestLog: new RequestLog("text", () => {}),
  });
  const server = await serveService(service, {
    hostname: "127.0.0.1",
    port: 0,
    drainTimeoutMs: 1000,
    signals: [],
  });
  const ws = await TestSocket.open(`ws://127.0.0.1:${server.addr.port}/v1/stream`);
  try {
    ws.send({ type: "generate", id: "c", prompt: "tell me a story", max_tokens: 2000, seed: 1 });
    const started = await ws.take((f) => f.id === "c" && f.type === "started");
    const taken = [];
    for (let i = 0; i < 3; i++) {
      taken.push(await ws.take((f) => f.id === "c" && f.type === "token"));
    }
    ws.send({ type: "cancel", id: "c" });
    const frames = [...taken, ...await ws.collect("c")];
    const done = frames.at(-1)!;
    assertEquals([done.type, done.finish_reason, done.timings], ["done", "cancelled", null]);
    const usage = done.usage as { prompt_tokens: number; completion_tokens: number };
    assertGreater(started.prompt_tokens as number, 0);
    assertEquals(usage.prompt_tokens, started.prompt_tokens);
    const tokens = frames.filter((f) => f.type === "token")
      .reduce((n, f) => n + (f.token_ids as number[]).length, 0);
    assertEquals(usage.completion_tokens, tokens);
    // How much of the prompt the prefix cache held, the backend never said: absent, not 0.
    assertEquals("cached_tokens" in usage, false, JSON.stringify(usage));
  } finally {
    await ws.close();
    service.close();
    await server.stop();
    await core.close();
  }
});

Deno.test("/v1/stream cancel mid-stream ends the generation and frees its KV blocks", async () => {
  await using svc = await startService({ tokenDelayMs: 10, contextLength: 4096, kvBlockSize: 4 });
  const ws = await TestSocket.open(svc.wsUrl);
  try {
    ws.send({ type: "generate", id: "long", prompt: "tell me a story", max_tokens: 2000, seed: 1 });
    const started = await ws.take((f) => f.id === "long" && f.type === "started");
    for (let i = 0; i < 3; i++) await ws.take((f) => f.id === "long" && f.type === "token");
    const before = await scrape(svc.base);
    assertGreater(metricValue(before, "llm_kv_blocks_used")!, 0);
    assertEquals(metricValue(before, "llm_inflight_generations"), 1);
    ws.send({ type: "cancel", id: "long" });
    // Tokens already in flight may precede the done frame; take them in order up to it.
    const done = (await ws.collect("long")).at(-1)!;
    assertEquals(done.type, "done");
    assertEquals(done.finish_reason, "cancelled");
    assertLess((done.usage as { completion_tokens: number }).completion_tokens, 2000);
    // A cancelled generation still counts the prompt it read.
    assertEquals((done.usage as { prompt_tokens: number }).prompt_tokens, started.prompt_tokens);
    assertGreater(started.prompt_tokens as number, 0);
    await waitUntil(() => svc.backend.active === 0, "the core to release the sequence");
    const after = await scrape(svc.base);
    assertEquals(metricValue(after, "llm_kv_blocks_used"), 0);
    assertEquals(metricValue(after, "llm_inflight_generations"), 0);
    assertEquals(
      metricValue(after, 'llm_generations_total{api="stream",finish_reason="cancelled"}'),
      1,
    );
    // Nothing for that id after its done frame: its generation has ended (the count above),
    // and a socket delivers in order, so a frame of it would arrive before this barrier's.
    ws.send({ type: "generate", id: "barrier", prompt: "x", max_tokens: 1 });
    await ws.collect("barrier");
    assertEquals(ws.frames.filter((f) => f.id === "long"), []);
    // The id is free again.
    ws.send({ type: "generate", id: "long", prompt: "again", max_tokens: 2, seed: 1 });
    assertEquals((await ws.collect("long")).at(-1)!.finish_reason, "length");
  } finally {
    await ws.close();
  }
});

Deno.test("/v1/stream closing the socket aborts every generation it started", async () => {
  await using svc = await startService({ tokenDelayMs: 10, contextLength: 4096 });
  const ws = await TestSocket.open(svc.wsUrl);
  ws.send({ type: "generate", id: "x", prompt: "one", max_tokens: 3000 });
  ws.send({ type: "generate", id: "y", prompt: "two", max_tokens: 3000 });
  await ws.take((f) => f.id === "x" && f.type === "token");
  await ws.take((f) => f.id === "y" && f.type === "token");
  assertEquals(svc.backend.active, 2);
  await ws.close();
  await waitUntil(() => svc.backend.active === 0, "both generations to be aborted");
  // The scheduler has dropped both sequences, so nothing can decode for them any more.
  await waitUntil(() => {
    const s = svc.backend.serving.schedulerStats();
    return s.running + s.waiting === 0;
  }, "the core to drop both sequences");
  const m = await scrape(svc.base);
  assertEquals(metricValue(m, "llm_kv_blocks_used"), 0);
  assertEquals(metricValue(m, "llm_inflight_generations"), 0);
  await waitUntil(() => svc.service.sockets === 0, "the session to be forgotten");
});

Deno.test("/v1/stream answers every bad frame with an error frame and keeps the socket", async () => {
  await using svc = await startService(
    { tokenDelayMs: 20, contextLength: 64, maxRunning: 1, maxWaiting: 0 },
    { maxFrameBytes: 2048 },
  );
  const ws = await TestSocket.open(svc.wsUrl);
  try {
    const cases: Array<[string, unknown, Record<string, unknown>, RegExp]> = [
      ["invalid JSON", "{not json", { code: "invalid_json" }, /not valid JSON/],
      ["not an object", "[1,2]", { code: "invalid_request" }, /JSON object with a 'type'.*\[1,2\]/],
      [
        "unknown type",
        { type: "fly", id: "q" },
        { code: "unknown_type", param: "type", id: "q" },
        /"fly".*generate, cancel/,
      ],
      [
        "missing id",
        { type: "generate", prompt: "hi" },
        { code: "invalid_request", param: "id" },
        /^Missing required field 'id' \(expected string\)$/,
      ],
      [
        "bad temperature",
        { type: "generate", id: "t", prompt: "hi", temperature: 9 },
        { code: "invalid_request", param: "temperature", id: "t" },
        /'temperature'.*<=2.*got 9/,
      ],
      [
        "wrong type",
        { type: "generate", id: "t2", prompt: "hi", max_tokens: "ten" },
        { code: "invalid_request", param: "max_tokens", id: "t2" },
        /expected number.*got "ten"/,
      ],
      [
        "prompt and messages",
        { type: "generate", id: "pm", prompt: "hi", messages: [{ role: "user", content: "x" }] },
        { code: "invalid_request", param: "messages", id: "pm" },
        /not both/,
      ],
      [
        "neither prompt nor messages",
        { type: "generate", id: "np" },
        { code: "invalid_request", param: "prompt", id: "np" },
        /one of 'prompt' or 'messages'/,
      ],
      [
        "bad role",
        { type: "generate", id: "r", messages: [{ role: "robot", content: "x" }] },
        { code: "invalid_request", param: "messages[0].role", id: "r" },
        /got "robot"/,
      ],
      [
        "misspelled field",
        { type: "generate", id: "m", prompt: "hi", maxTokens: 3 },
        { code: "invalid_request", param: "maxTokens", id: "m" },
        /Unknown field 'maxTokens'/,
      ],
      [
        "cancel of unknown id",
        { type: "cancel", id: "nobody" },
        { code: "unknown_id", param: "id", id: "nobody" },
        /No live generation with id "nobody"/,
      ],
      [
        "frame too large",
        JSON.stringify({ type: "generate", id: "big", prompt: "w ".repeat(2000) }),
        { code: "frame_too_large" },
        /is 40\d\d bytes; the limit is 2048 bytes/,
      ],
      [
        "prompt too long",
        { type: "generate", id: "long", prompt: "w ".repeat(70) },
        { code: "context_length_exceeded", param: "prompt", id: "long" },
        /prompt is 72 tokens but the model's context is 64 tokens/,
      ],
    ];
    for (const [name, frame, want, message] of cases) {
      ws.send(frame);
      const f = await ws.take();
      assertEquals(f.type, "error", name);
      for (const [k, v] of Object.entries(want)) assertEquals(f[k], v, `${name}: ${k}`);
      assertMatch(f.message as string, message, name);
    }
    // Binary frames are refused.
    ws.ws.send(new Uint8Array([1, 2, 3]));
    const bin = await ws.take();
    assertEquals([bin.type, bin.code], ["error", "unsupported_frame"]);

    // Duplicate live id, then overload (the only running slot is taken and no queue).
    ws.send({ type: "generate", id: "d", prompt: "hold the slot", max_tokens: 10 });
    await ws.take((f) => f.id === "d" && f.type === "started");
    ws.send({ type: "generate", id: "d", prompt: "again" });
    const dup = await ws.take((f) => f.id === "d" && f.type === "error");
    assertEquals([dup.code, dup.param], ["duplicate_id", "id"]);
    assertMatch(dup.message as string, /"d" is already running/);
    ws.send({ type: "generate", id: "o", prompt: "over" });
    const over = await ws.take((f) => f.id === "o");
    assertEquals([over.type, over.code], ["error", "overloaded"]);
    // The running generation was not disturbed by any of this.
    const rest = await ws.collect("d");
    assertEquals(rest.at(-1)!.finish_reason, "length");
    assertEquals(textOf(rest).length > 0, true);

    const m = await scrape(svc.base);
    assertEquals(metricValue(m, 'llm_errors_total{code="invalid_request"}'), 8);
    assertEquals(metricValue(m, 'llm_errors_total{code="overloaded"}'), 1);
    assertEquals(metricValue(m, 'llm_errors_total{code="duplicate_id"}'), 1);
  } finally {
    await ws.close();
  }
});

Deno.test("/v1/stream renders chat messages and caps max_tokens to the context", async () => {
  await using svc = await startService({ contextLength: 64 });
  const ws = await TestSocket.open(svc.wsUrl);
  try {
    ws.send({
      type: "generate",
      id: "c",
      messages: [{ role: "system", content: "Be brief." }, {
        role: "user",
        content: "Hello there",
      }],
      max_tokens: 500,
      seed: 5,
    });
    const frames = await ws.collect("c");
    const prompt = "System: Be brief.\nUser: Hello there\nAssistant:";
    const req = svc.backend.requests[0]!;
    assertEquals(req.prompt, svc.backend.tokenize(prompt, { bos: true, special: false }));
    assertEquals(req.stop, ["\nUser:", "\nSystem:"]);
    const room = 64 - svc.backend.countTokens(prompt);
    assertEquals(req.maxTokens, room);
    assertEquals(frames[0]!.max_tokens, room);
    assertEquals((frames.at(-1)!.usage as { completion_tokens: number }).completion_tokens, room);
  } finally {
    await ws.close();
  }
});

Deno.test("/v1/stream pushes stats frames after subscribe_stats and stops after unsubscribe", async () => {
  await using svc = await startService({ tokenDelayMs: 10, contextLength: 4096 }, {
    statsIntervalMs: 30,
  });
  const ws = await TestSocket.open(svc.wsUrl);
  try {
    ws.send({ type: "generate", id: "g", prompt: "stats please", max_tokens: 1000 });
    await ws.take((f) => f.type === "token");
    ws.send({ type: "subscribe_stats" });
    const s1 = await ws.take((f) => f.type === "stats");
    const s2 = await ws.take((f) => f.type === "stats");
    const core = svc.backend.stats();
    for (const s of [s1, s2]) {
      assertEquals(s.running, 1);
      assertEquals(s.waiting, 0);
      assertEquals(s.kv_blocks_total, core.kvBlocksTotal);
      assertGreater(s.kv_blocks_used as number, 0);
      assertEquals(s.executor_healthy, true);
      assertEquals(s.inflight, 1);
    }
    ws.send({ type: "unsubscribe_stats" });
    ws.send({ type: "cancel", id: "g" });
    // Frames are handled in order: once the cancel is answered, the unsubscribe was handled.
    await ws.take((f) => f.type === "done");
    ws.frames.length = 0;
    // Proof that time passed with stats timers running: another socket's subscription ticks
    // twice. The first socket got no stats frame meanwhile.
    const other = await TestSocket.open(svc.wsUrl);
    try {
      other.send({ type: "subscribe_stats" });
      await other.take((f) => f.type === "stats");
      await other.take((f) => f.type === "stats");
    } finally {
      await other.close();
    }
    assertEquals(ws.frames.filter((f) => f.type === "stats"), []);
  } finally {
    await ws.close();
  }
});

Deno.test("/v1/stream requires the API key in the header or the api_key parameter", async () => {
  await using svc = await startService({}, { apiKeys: ["s3cret"] });
  const refused = await fetch(svc.base + "/v1/stream", { headers: { upgrade: "websocket" } });
  assertEquals(refused.status, 401);
  assertEquals((await refused.json()).error.code, "unauthorized");
  for (
    const sock of [
      await TestSocket.open(svc.wsUrl, { authorization: "Bearer s3cret" }),
      await TestSocket.open(svc.wsUrl + "?api_key=s3cret"),
    ]
  ) {
    sock.send({ type: "generate", id: "k", prompt: "hi", max_tokens: 2 });
    assertEquals((await sock.collect("k")).at(-1)!.type, "done");
    await sock.close();
  }
  const bad = await fetch(svc.base + "/v1/stream?api_key=nope", {
    headers: { upgrade: "websocket" },
  });
  assertEquals(bad.status, 401);
  assertEquals((await bad.json()).error.message, "Invalid API key");
});

Deno.test("/v1/stream refuses new generations while draining", async () => {
  await using svc = await startService({ tokenDelayMs: 5 });
  const ws = await TestSocket.open(svc.wsUrl);
  try {
    ws.send({ type: "generate", id: "old", prompt: "finish me", max_tokens: 10, seed: 2 });
    await ws.take((f) => f.id === "old" && f.type === "token");
    const drained = svc.service.drain({ timeoutMs: 5000 });
    ws.send({ type: "generate", id: "new", prompt: "too late" });
    const refused = await ws.take((f) => f.id === "new");
    assertEquals([refused.type, refused.code, refused.message], [
      "error",
      "draining",
      DRAINING_MESSAGE,
    ]);
    const rest = await ws.collect("old");
    assertEquals(rest.at(-1)!.finish_reason, "length");
    assertEquals(await drained, { completed: true, aborted: 0 });
    const closed = await ws.closed;
    assertEquals(closed.code, 1001);
  } finally {
    await ws.close();
  }
});

Deno.test("/v1/stream gives a client that stops reading backpressure, then disconnects it", async () => {
  const tokenBytes = 65536;
  // The pool holds 4096 positions: run to its end, the generation would send 256 MiB.
  await using svc = await startService(
    { tokenDelayMs: 0, tokenPadding: tokenBytes, contextLength: 1 << 30, maxWaiting: 1 },
    { wsHighWaterBytes: 256 * 1024, wsStallTimeoutMs: 1500 },
  );
  const raw = await RawWebSocket.connect(svc.wsUrl);
  try {
    await raw.sendText(
      JSON.stringify({ type: "generate", id: "flood", prompt: "p", max_tokens: 1_000_000 }),
    );
    await waitUntil(() => svc.backend.tokensYielded > 0, "generation to start");
    // The client reads nothing: after the stall timeout the server gives up on it and the
    // generation ends (an event), having pulled only what the socket buffers could hold.
    await waitUntil(() => svc.backend.active === 0, "the stalled client to be disconnected", 6000);
    const produced = svc.backend.tokensYielded;
    console.log(`backpressure: ${produced} tokens of ${tokenBytes} bytes before the disconnect`);
    // Bounded by the kernel's socket buffers plus the high-water mark, far below the pool.
    assertLess(produced * tokenBytes, 64 * 1024 * 1024);
    // And the core held the sequence: the engine computed little beyond what was sent (the
    // client buffer of 16 events and the steps in flight), not the pool's 4096 positions.
    assertLess(svc.backend.tokensComputed, produced + 64);
  } finally {
    raw.close();
  }
  await waitUntil(() => svc.service.sockets === 0, "the session to close");
});

Deno.test("/v1/stream lets a client reuse an id as soon as its done frame arrives", async () => {
  await using svc = await startService({ tokenDelayMs: 5, contextLength: 4096 });
  const ws = await TestSocket.open(svc.wsUrl);
  try {
    ws.send({ type: "generate", id: "r", prompt: "short", max_tokens: 1 });
    await ws.take((f) => f.id === "r" && f.type === "done");
    ws.send({ type: "generate", id: "r", prompt: "long", max_tokens: 3000 });
    await ws.take((f) => f.id === "r" && f.type === "token");
    ws.send({ type: "generate", id: "r", prompt: "third" });
    const dup = await ws.take((f) => f.id === "r" && f.type === "error");
    assertEquals(dup.code, "duplicate_id");
    ws.send({ type: "cancel", id: "r" });
    const done = await ws.take((f) => f.id === "r" && f.type === "done");
    assertEquals(done.finish_reason, "cancelled");
    await waitUntil(() => svc.backend.active === 0, "the second generation to be released");
    assertEquals(new Set(svc.backend.requests.map((r) => r.requestId)).size, 2);
  } finally {
    await ws.close();
  }
});

Deno.test("Upgrade: websocket without Connection: Upgrade is answered 400 naming the header, not 500", async () => {
  await using svc = await startService();
  const key = "dGhlIHNhbXBsZSBub25jZQ==";
  const noConnection = await rawHttp(
    svc.base,
    `GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n` +
      `Sec-WebSocket-Key: ${key}\r\nSec-WebSocket-Version: 13\r\nConnection: close\r\n\r\n`,
  );
  assertEquals(noConnection.status, 400, noConnection.head);
  assertEquals(JSON.parse(noConnection.body).error.code, "invalid_request");
  assertMatch(JSON.parse(noConnection.body).error.message, /Connection: Upgrade/);
});

Deno.test("an idle WebSocket is closed with 1000 after the idle timeout; one running a generation is not", async () => {
  await using svc = await startService({ tokenDelayMs: 30, contextLength: 1024 }, {
    wsIdleTimeoutMs: 300,
  });
  const idle = await TestSocket.open(svc.wsUrl);
  const busy = await TestSocket.open(svc.wsUrl);
  try {
    // 30 tokens at 30 ms: the generation outlives the idle timeout several times over.
    busy.send({ type: "generate", id: "g", prompt: "keep going", max_tokens: 30 });
    let timer: ReturnType<typeof setTimeout> | undefined;
    const closed = await Promise.race([
      idle.closed,
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error("the idle socket was still open after 5 s")),
          5000,
        );
      }),
    ]).finally(() => clearTimeout(timer));
    assertEquals(closed.code, 1000);
    assertMatch(closed.reason, /idle/);
    const frames = await busy.collect("g");
    assertEquals(frames.at(-1)!.finish_reason, "length");
    assertEquals(frames.filter((f) => f.type === "token").length, 30);
  } finally {
    await idle.close();
    await busy.close();
  }
});

Deno.test("one client may hold only so many WebSockets: past it the upgrade is 429, and a closed one frees a place", async () => {
  await using svc = await startService({}, { wsMaxPerClient: 3 });
  const open = await Promise.all([0, 1, 2].map(() => TestSocket.open(svc.wsUrl)));
  const upgrade = () =>
    rawHttp(
      svc.base,
      `GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
        `Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`,
    );
  try {
    assertEquals((await upgrade()).status, 429);
    await open[0]!.close();
    await waitUntil(async () => (await upgrade()).status === 101, "a place to free up");
  } finally {
    for (const s of open) await s.close();
  }
});
