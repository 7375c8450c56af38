import { assertEquals, assertMatch } from "@std/assert";
import { TestSocket } from "./_http_harness.ts";

/** Starts tests/_serve_fake_child.ts and returns it with its port and a stdout line reader. */
async function spawnServer(drainTimeoutMs: number, holdAfter?: number, release?: "usr1") {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-net",
      "--allow-read",
      "--allow-env",
      new URL("./_serve_fake_child.ts", import.meta.url).pathname,
      String(drainTimeoutMs),
      ...(holdAfter === undefined ? [] : [String(holdAfter)]),
      ...(release === undefined ? [] : [release]),
    ],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const lines = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = "";
  const nextLine = async (): Promise<string> => {
    for (;;) {
      const nl = buffered.indexOf("\n");
      if (nl >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        return line;
      }
      const { done, value } = await lines.read();
      if (done) throw new Error(`server stdout ended; got ${JSON.stringify(buffered)}`);
      buffered += value;
    }
  };
  const first = await nextLine();
  assertMatch(first, /^listening \d+$/);
  return { child, port: Number(first.split(" ")[1]), nextLine, lines };
}

/** Resolves once the server's /ready answers 503 naming "draining". */
async function untilDraining(port: number): Promise<void> {
  // A hang guard, not a speed bound: a loaded machine may take seconds to deliver the signal.
  const guard = performance.now() + 60_000;
  while (performance.now() < guard) {
    const res = await fetch(`http://127.0.0.1:${port}/ready`);
    const body = await res.json();
    if (res.status === 503 && body.reasons?.includes("draining")) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error("the server never reported draining on /ready within 60 s");
}

Deno.test("SIGTERM lets an in-flight generation finish, refuses new ones, and exits 0", async () => {
  // The deadline is a hang guard only. The server holds the generation's steps after its first
  // token until SIGUSR1, so it is still in flight when "b" arrives however slow the machine.
  const { child, port, nextLine, lines } = await spawnServer(60_000, 1, "usr1");
  const ws = await TestSocket.open(`ws://127.0.0.1:${port}/v1/stream`);
  try {
    ws.send({ type: "generate", id: "a", prompt: "finish this", max_tokens: 15, seed: 1 });
    await ws.take((f) => f.id === "a" && f.type === "token");
    child.kill("SIGTERM");
    // Draining: the socket still works for what it started, but new generations are refused.
    // Sent once the server says it drains (/ready's reasons), not after a guessed delay.
    await untilDraining(port);
    ws.send({ type: "generate", id: "b", prompt: "too late" });
    const refused = await ws.take((f) => f.id === "b");
    assertEquals([refused.type, refused.code], ["error", "draining"]);
    child.kill("SIGUSR1");
    const frames = await ws.collect("a");
    assertEquals(frames.at(-1)!.finish_reason, "length");
    assertEquals(frames.filter((f) => f.type === "token").length, 14); // one taken above
    assertEquals((await ws.closed).code, 1001);
    assertEquals(await nextLine(), 'drained {"completed":true,"aborted":0}');
    assertEquals((await child.status).code, 0);
  } finally {
    await ws.close();
    await lines.cancel();
  }
});

Deno.test("SIGTERM aborts generations still running at the drain deadline and exits 0", async () => {
  const { child, port, nextLine, lines } = await spawnServer(150);
  const ws = await TestSocket.open(`ws://127.0.0.1:${port}/v1/stream`);
  try {
    ws.send({ type: "generate", id: "long", prompt: "never ends", max_tokens: 100 });
    await ws.take((f) => f.id === "long" && f.type === "token");
    child.kill("SIGTERM");
    const done = await ws.take((f) => f.id === "long" && f.type === "done");
    assertEquals(done.finish_reason, "cancelled");
    assertEquals(await nextLine(), 'drained {"completed":false,"aborted":1}');
    assertEquals((await child.status).code, 0);
  } finally {
    await ws.close();
    await lines.cancel();
  }
});

Deno.test("serveService() names the address it could not listen on", async () => {
  const { createApp } = await import("../lib/http/app.ts");
  const { serveService } = await import("../lib/http/serve.ts");
  const { FakeCore } = await import("./_fake_core.ts");
  using taken = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = taken.addr.port;
  await using backend = new FakeCore();
  const service = createApp({ backend });
  let message = "";
  try {
    await serveService(service, { hostname: "127.0.0.1", port, drainTimeoutMs: 10, signals: [] });
  } catch (e) {
    message = (e as Error).message;
  }
  assertMatch(
    message,
    new RegExp(`Cannot listen on 127\\.0\\.0\\.1:${port}: .*in use.*--port`, "i"),
  );
});

/** Reads an SSE response until its first `data:` event, returning the text read so far. */
async function firstEvent(reader: ReadableStreamDefaultReader<string>): Promise<string> {
  let text = "";
  while (!text.includes("\n\n")) {
    const { done, value } = await reader.read();
    if (done) break;
    text += value;
  }
  return text;
}

async function readRest(reader: ReadableStreamDefaultReader<string>, head: string) {
  let text = head;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return text;
    text += value;
  }
}

Deno.test("SIGTERM: every HTTP and SSE answer whose generation finished reaches its client", async () => {
  const { FakeCore } = await import("./_fake_core.ts");
  const { parseSse } = await import("./_http_harness.ts");
  await using oracle = new FakeCore({ contextLength: 1024 });
  const n = 4;
  // The server holds every step after the 2n generations' first tokens until SIGTERM.
  const { child, port, nextLine, lines } = await spawnServer(10_000, 2 * n);
  const base = `http://127.0.0.1:${port}`;
  const maxTokens = 12;
  const prompt = (i: number) => `answer number ${i}`;
  const body = (i: number, stream: boolean) =>
    JSON.stringify({ prompt: prompt(i), max_tokens: maxTokens, temperature: 0, stream });
  const post = (i: number, stream: boolean) =>
    fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: body(i, stream),
    });
  try {
    const plain = Array.from({ length: n }, (_, i) => post(i, false));
    const streams = await Promise.all(Array.from({ length: n }, (_, i) => post(n + i, true)));
    const readers = streams.map((r) => r.body!.pipeThrough(new TextDecoderStream()).getReader());
    const heads = await Promise.all(readers.map(firstEvent));
    // All 2n generations are running, and held there (the SSE ones have produced a token; the
    // plain ones may reach the core a little later): drain now.
    const { metricValue, scrape } = await import("./_http_harness.ts");
    const guard = performance.now() + 60_000; // a hang guard, not a speed bound
    let inflight = metricValue(await scrape(base), "llm_inflight_generations");
    while (inflight !== 2 * n && performance.now() < guard) {
      await new Promise((r) => setTimeout(r, 10));
      inflight = metricValue(await scrape(base), "llm_inflight_generations");
    }
    assertEquals(inflight, 2 * n);
    child.kill("SIGTERM");
    const answers = await Promise.allSettled(plain.map(async (p) => (await p).json()));
    const sse = await Promise.allSettled(readers.map((r, i) => readRest(r, heads[i]!)));
    for (let i = 0; i < n; i++) {
      const a = answers[i]!;
      assertEquals(
        a.status,
        "fulfilled",
        `plain answer ${i}: ${(a as PromiseRejectedResult).reason}`,
      );
      const json = (a as PromiseFulfilledResult<any>).value;
      assertEquals(json.choices[0].text, oracle.continuation(prompt(i), maxTokens).text);
      assertEquals(json.choices[0].finish_reason, "length");
    }
    for (let i = 0; i < n; i++) {
      const s = sse[i]!;
      assertEquals(
        s.status,
        "fulfilled",
        `SSE answer ${i}: ${(s as PromiseRejectedResult).reason}`,
      );
      const events = parseSse((s as PromiseFulfilledResult<string>).value);
      assertEquals(events.at(-1), "[DONE]");
      const text = events.slice(0, -1).map((e: any) => e.choices[0].text).join("");
      assertEquals(text, oracle.continuation(prompt(n + i), maxTokens).text);
    }
    assertEquals(await nextLine(), 'drained {"completed":true,"aborted":0}');
    assertEquals((await child.status).code, 0);
  } finally {
    await lines.cancel();
  }
});

Deno.test("SIGTERM: HTTP generations cut at the drain deadline get 503 draining, SSE an error event", async () => {
  const { child, port, nextLine, lines } = await spawnServer(200);
  const base = `http://127.0.0.1:${port}`;
  const post = (stream: boolean) =>
    fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "never ends", max_tokens: 500, stream }),
    });
  try {
    const plain = post(false);
    const stream = await post(true);
    const reader = stream.body!.pipeThrough(new TextDecoderStream()).getReader();
    const head = await firstEvent(reader);
    child.kill("SIGTERM");
    const res = await plain;
    assertEquals(res.status, 503);
    assertEquals((await res.json()).error.code, "draining");
    const { parseSse } = await import("./_http_harness.ts");
    const events = parseSse(await readRest(reader, head));
    assertEquals((events.at(-1) as any).error.code, "draining");
    assertEquals(await nextLine(), 'drained {"completed":false,"aborted":2}');
    assertEquals((await child.status).code, 0);
  } finally {
    await lines.cancel();
  }
});

Deno.test("a connection that trickles its head past the header timeout is answered 408", async () => {
  const { startService } = await import("./_http_harness.ts");
  await using svc = await startService({}, {}, { headerTimeoutMs: 300 });
  const port = Number(new URL(svc.base).port);
  const answers = await Promise.all(Array.from({ length: 20 }, async () => {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port });
    try {
      await conn.write(
        new TextEncoder().encode("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "),
      );
      let text = "";
      const buf = new Uint8Array(1024);
      for (let n = await conn.read(buf); n !== null; n = await conn.read(buf)) {
        text += new TextDecoder().decode(buf.subarray(0, n));
      }
      return text;
    } catch (e) {
      return `error: ${e}`;
    } finally {
      try {
        conn.close();
      } catch { /* closed by the server */ }
    }
  }));
  for (const a of answers) assertMatch(a, /^HTTP\/1\.1 408 /);
});

Deno.test("an h2c upgrade (curl --http2) is refused at once with 400 saying to use HTTP/1.1", async () => {
  const { rawHttp, startService } = await import("./_http_harness.ts");
  await using svc = await startService();
  const res = await rawHttp(
    svc.base,
    "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings\r\n" +
      "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
  );
  assertEquals(res.status, 400, res.head);
  const err = JSON.parse(res.body).error;
  assertEquals(err.code, "invalid_request");
  assertMatch(err.message, /"h2c" is not supported.*HTTP\/1\.1/);
  // WebSocket upgrades still work.
  const { TestSocket } = await import("./_http_harness.ts");
  const ws = await TestSocket.open(svc.wsUrl);
  ws.send({ type: "generate", id: "a", prompt: "hi", max_tokens: 2 });
  assertEquals((await ws.collect("a")).at(-1)!.type, "done");
  await ws.close();
});
