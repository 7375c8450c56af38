/**
 * The result cache and the prefix cache keep each API key's work to itself (`cacheScope`
 * "key", the default): no hit, no `saved_ms` and no `cached_tokens` crosses keys, over HTTP and
 * the WebSocket; "global" shares them. Real HTTP app and serving core, fake model.
 */
import { assertEquals, assertGreater } from "@std/assert";
import { createApp } from "../lib/http/app.ts";
import { RequestLog } from "../lib/http/request_log.ts";
import { serveService } from "../lib/http/serve.ts";
import { CachedBackend } from "../lib/backend/cached_backend.ts";
import { FakeCore } from "./_fake_core.ts";
import { TestSocket } from "./_http_harness.ts";

const A = "sk-tenant-a";
const B = "sk-tenant-b";

async function serve(cacheScope?: "key" | "global") {
  const inner = new FakeCore({ contextLength: 1024 });
  const backend = new CachedBackend(inner, 1 << 20);
  const service = createApp({
    backend,
    apiKeys: [A, B],
    cacheScope,
    requestLog: new RequestLog("text", () => {}),
  });
  const server = await serveService(service, {
    hostname: "127.0.0.1",
    port: 0,
    drainTimeoutMs: 1000,
    signals: [],
  });
  const base = `http://127.0.0.1:${server.addr.port}`;
  return {
    base,
    ws: (key: string) => `ws://127.0.0.1:${server.addr.port}/v1/stream?api_key=${key}`,
    async complete(key: string, body: Record<string, unknown>) {
      const res = await fetch(`${base}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
        body: JSON.stringify(body),
      });
      const json = await res.json();
      assertEquals(res.status, 200, JSON.stringify(json));
      return json;
    },
    async [Symbol.asyncDispose]() {
      service.close();
      await server.stop();
      await inner.close();
    },
  };
}

/** A prompt of many 16-token blocks whose words are distinct from the next test's. */
const longPrompt = (tag: string) =>
  Array.from({ length: 40 }, (_, i) => `${tag} patient ${i} is Alice Smith`).join(", ");

Deno.test("the result cache answers a key only from its own requests", async () => {
  await using svc = await serve();
  const req = { prompt: "Once upon a time", max_tokens: 12, temperature: 0 };
  const first = await svc.complete(A, req);
  assertEquals(first.cached, false);
  const other = await svc.complete(B, req);
  assertEquals(other.cached, false, "key B was answered from key A's request");
  assertEquals(other.saved_ms, undefined);
  assertEquals(other.choices[0].text, first.choices[0].text);
  const again = await svc.complete(A, req);
  assertEquals(again.cached, true, "key A's own repeat is a hit");
});

Deno.test("the prefix cache reports no cached_tokens for another key's prompt", async () => {
  await using svc = await serve();
  const req = { prompt: longPrompt("x"), max_tokens: 1, temperature: 0.5 };
  await svc.complete(A, req);
  const other = await svc.complete(B, req);
  assertEquals(other.usage.prompt_tokens_details.cached_tokens, 0);
  const again = await svc.complete(A, req);
  assertGreater(again.usage.prompt_tokens_details.cached_tokens, 0);
});

Deno.test("a WebSocket gets its key's scope: no hit from another key's HTTP request", async () => {
  await using svc = await serve();
  const req = { prompt: longPrompt("y"), max_tokens: 4, temperature: 0 };
  await svc.complete(A, req);
  for (const [key, cached] of [[B, false], [A, true]] as const) {
    const ws = await TestSocket.open(svc.ws(key));
    try {
      ws.send({ type: "generate", id: "g", ...req });
      const done = (await ws.collect("g")).at(-1)!;
      assertEquals(done.cached, cached, `key ${key}`);
      if (!cached) assertEquals((done.usage as Record<string, number>).cached_tokens, 0);
    } finally {
      await ws.close();
    }
  }
});

Deno.test("--cache-scope global shares both caches among keys", async () => {
  await using svc = await serve("global");
  const req = { prompt: longPrompt("z"), max_tokens: 3, temperature: 0 };
  await svc.complete(A, req);
  const other = await svc.complete(B, req);
  assertEquals(other.cached, true);
  const prefix = await svc.complete(B, { ...req, temperature: 0.5 });
  assertGreater(prefix.usage.prompt_tokens_details.cached_tokens, 0);
});
