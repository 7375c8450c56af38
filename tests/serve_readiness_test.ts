/**
 * The server binds its port before it loads the model: while a slow download runs, /health
 * says how far it got and /ready answers 503; a port already in use is reported before any
 * loading starts.
 */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { modelFile } from "./harness/model_files.ts";

const GGUF = Deno.readFileSync(modelFile("stories260K-ctx512.gguf"));

/**
 * Serves the GGUF over HTTP: the first half at once, the rest after release(). Each request
 * waits at the gate, so the download stays in progress for as long as the test needs.
 */
function gatedModelServer() {
  let release!: () => void;
  const gate = new Promise<void>((r) => release = r);
  const half = Math.floor(GGUF.length / 2);
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, () => {
    const body = new ReadableStream<Uint8Array>({
      async start(ctrl) {
        ctrl.enqueue(GGUF.slice(0, half));
        await gate;
        ctrl.enqueue(GGUF.slice(half));
        ctrl.close();
      },
    });
    return new Response(body, { headers: { "content-length": String(GGUF.length) } });
  });
  const { port } = server.addr as Deno.NetAddr;
  return {
    url: `http://127.0.0.1:${port}/slow/readiness-model.gguf`,
    half,
    release,
    async [Symbol.asyncDispose]() {
      release();
      await server.shutdown();
    },
  };
}

/** Files under `dir` (recursively) of exactly `bytes` bytes. */
function completeCopies(dir: string, bytes: number): string[] {
  const found: string[] = [];
  for (const e of Deno.readDirSync(dir)) {
    const path = `${dir}/${e.name}`;
    if (e.isDirectory) found.push(...completeCopies(path, bytes));
    else if (e.isFile && Deno.statSync(path).size === bytes) found.push(path);
  }
  return found;
}

/** `main.ts serve` in a child; resolves the stderr text as it grows. */
function spawnServe(args: string[]) {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", new URL("../main.ts", import.meta.url).pathname, "serve", ...args],
    stdout: "null",
    stderr: "piped",
  }).spawn();
  let log = "";
  const waiters: Array<() => void> = [];
  const done = (async () => {
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
      log += chunk;
      for (const w of waiters.splice(0)) w();
    }
    for (const w of waiters.splice(0)) w();
  })();
  const waitFor = async (re: RegExp): Promise<RegExpExecArray> => {
    for (;;) {
      const m = re.exec(log);
      if (m) return m;
      const ended = await Promise.race([
        new Promise<false>((r) => waiters.push(() => r(false))),
        done.then(() => true),
      ]);
      if (ended && !re.exec(log)) throw new Error(`stderr never matched ${re}:\n${log}`);
    }
  };
  return { child, waitFor, log: () => log, done };
}

async function getJson(url: string) {
  const res = await fetch(url);
  return [res.status, await res.json()] as const;
}

Deno.test("while the model downloads, the server listens: /health reports the phase and progress, /ready and the API answer 503", async () => {
  await using model = gatedModelServer();
  const dir = await Deno.makeTempDir({ prefix: "readiness_" });
  const srv = spawnServe([
    "--model",
    model.url,
    "--models-dir",
    dir,
    "--port",
    "0",
    "--backend",
    "cpu",
    "--kv-memory",
    "2MiB",
  ]);
  try {
    const base = (await srv.waitFor(/listening on (http:\/\/\S+?)\//))[1]!;
    // Poll until the first half has arrived (the download cannot finish before release()).
    let health: Record<string, unknown> = {};
    for (;;) {
      const [status, body] = await getJson(`${base}/health`);
      assertEquals(status, 200);
      health = body;
      if (body.phase === "downloading" && body.bytes >= model.half) break;
      await new Promise((r) => setTimeout(r, 10));
    }
    assertEquals(health.status, "loading");
    assertEquals(health.total_bytes, GGUF.length);
    assertEquals(health.progress, (health.bytes as number) / GGUF.length);
    assert((health.progress as number) < 1);
    const [readyStatus, ready] = await getJson(`${base}/ready`);
    assertEquals(readyStatus, 503);
    assertStringIncludes(ready.reasons[0], "model loading (downloading)");
    const api = await fetch(`${base}/v1/completions`, {
      headers: { "content-type": "application/json" },
      method: "POST",
      body: JSON.stringify({ prompt: "x" }),
    });
    assertEquals(api.status, 503);
    assertEquals(api.headers.get("retry-after"), "1");
    assertEquals((await api.json()).error.code, "loading");

    model.release();
    await srv.waitFor(/llmserve ready/);
    const [after, body] = await getJson(`${base}/ready`);
    assertEquals([after, body.status], [200, "ready"]);
    assertEquals((await getJson(`${base}/health`))[1], { status: "ok", phase: "ready" });
    const res = await fetch(`${base}/v1/completions`, {
      headers: { "content-type": "application/json" },
      method: "POST",
      body: JSON.stringify({ prompt: "Once", max_tokens: 3, temperature: 0 }),
    });
    assertEquals(res.status, 200);
    await res.body?.cancel();
  } finally {
    srv.child.kill("SIGTERM");
    assertEquals((await srv.child.status).code, 0, srv.log());
    await srv.done;
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a port in use is reported at once, before the model loads", async () => {
  await using model = gatedModelServer();
  const dir = await Deno.makeTempDir({ prefix: "readiness_" });
  const taken = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  try {
    const port = (taken.addr as Deno.NetAddr).port;
    // The model's download would wait for release(), which never comes: only binding first
    // lets the process fail.
    const srv = spawnServe(["--model", model.url, "--models-dir", dir, "--port", String(port)]);
    const status = await srv.child.status;
    await srv.done;
    assertEquals(status.code, 1);
    assertStringIncludes(srv.log(), `Cannot listen on 127.0.0.1:${port}`);
    assertStringIncludes(srv.log(), "pick another --port");
    // It failed before the model loaded: no file in the models directory holds the whole model.
    assertEquals(completeCopies(dir, GGUF.length), []);
  } finally {
    taken.close();
    await Deno.remove(dir, { recursive: true });
  }
});
