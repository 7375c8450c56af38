import { assertEquals, assertMatch } from "@std/assert";
import { TestSocket } from "./_http_harness.ts";

/** Starts tests/_serve_fake_child.ts and returns it with its port and a stdout line reader. */
async function spawnServer(drainTimeoutMs: number) {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-net",
      "--allow-read",
      "--allow-env",
      new URL("./_serve_fake_child.ts", import.meta.url).pathname,
      String(drainTimeoutMs),
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

Deno.test("SIGTERM lets an in-flight generation finish, refuses new ones, and exits 0", async () => {
  const { child, port, nextLine, lines } = await spawnServer(5000);
  const ws = await TestSocket.open(`ws://127.0.0.1:${port}/v1/stream`);
  try {
    ws.send({ type: "generate", id: "a", prompt: "finish this", max_tokens: 15, seed: 1 });
    await ws.take((f) => f.id === "a" && f.type === "token");
    child.kill("SIGTERM");
    // Draining: the socket still works for what it started, but new generations are refused.
    await new Promise((r) => setTimeout(r, 50));
    ws.send({ type: "generate", id: "b", prompt: "too late" });
    const refused = await ws.take((f) => f.id === "b");
    assertEquals([refused.type, refused.code], ["error", "draining"]);
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
