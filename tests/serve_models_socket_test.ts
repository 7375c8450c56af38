/**
 * A WebSocket for a model that is not loaded, on a server of several models: the upgrade is
 * answered at once, `loading` frames say how the load goes, a generate frame sent meanwhile is
 * answered once the model is loaded (with `generate`'s text for the file); a model whose load
 * fails ends the socket with an error frame and 1011; a loaded model's socket gets no loading
 * frame.
 */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { compatPath, generateAlone as generateCompat } from "./harness/compat.ts";
import { TestSocket } from "./_http_harness.ts";
import { spawnCpuServer } from "./_serve_child.ts";

const A = "stories260K-q4_1";
const C = "tinyllama-like-q4_0";
const BROKEN = "broken";
const PROMPT = "Once upon a time";
const N = 12;
/** Long enough for a load on a contended machine: the test waits for frames, not for time. */
const WAIT = 120_000;

const generateAlone = (stem: string) => generateCompat(stem, PROMPT, N);

Deno.test("a WebSocket hears its model load in `loading` frames, then is served", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "serve_models_socket_" });
  const whole = await Deno.readFile(compatPath(A));
  await Deno.writeFile(`${dir}/${BROKEN}.gguf`, whole.subarray(0, whole.length >> 1));
  const [oracle, server] = await Promise.all([
    generateAlone(C),
    spawnCpuServer([
      "--model",
      compatPath(A),
      "--model",
      compatPath(C),
      "--model",
      `${dir}/${BROKEN}.gguf`,
    ]),
  ]);
  const ws = server.base.replace("http", "ws");
  const generate = { type: "generate", id: "g", prompt: PROMPT, max_tokens: N, temperature: 0 };
  try {
    await t.step(
      "the socket opens before the load; the generate sent meanwhile is answered after it",
      async () => {
        const sock = await TestSocket.open(`${ws}/v1/stream?model=${C}`);
        sock.send(generate);
        const frames = await sock.collect("g", WAIT);
        const loading = sock.frames.filter((f) => f.type === "loading");
        assert(loading.length >= 1, JSON.stringify(sock.frames).slice(0, 300));
        for (const f of loading) {
          assertEquals(f.model, C);
          assertEquals(typeof f.bytes, "number");
          if (f.total_bytes !== undefined) assert((f.bytes as number) <= (f.total_bytes as number));
        }
        assertEquals(frames[0]!.type, "started");
        assertEquals(frames.at(-1)!.type, "done");
        assertEquals(frames.filter((f) => f.type === "token").map((f) => f.text).join(""), oracle);
        await sock.close();
        const h = await (await fetch(`${server.base}/health`)).json();
        assertEquals(h.models[C].phase, "loaded");
      },
    );

    await t.step("a loaded model's socket gets no loading frame", async () => {
      const sock = await TestSocket.open(`${ws}/v1/stream?model=${C}`);
      sock.send(generate);
      const frames = await sock.collect("g", WAIT);
      assertEquals(frames[0]!.type, "started");
      assertEquals(sock.frames.filter((f) => f.type === "loading"), [], "nothing else was queued");
      assertEquals(frames.filter((f) => f.type === "token").map((f) => f.text).join(""), oracle);
      await sock.close();
    });

    await t.step("a load that fails ends the socket with its error and 1011", async () => {
      const sock = await TestSocket.open(`${ws}/v1/stream?model=${BROKEN}`);
      const first = await sock.take(() => true, WAIT);
      assertEquals(first.type, "loading");
      assertEquals(first.model, BROKEN);
      const error = await sock.take((f) => f.type === "error", WAIT);
      assertEquals(error.code, "model_load_failed");
      assertStringIncludes(error.message as string, BROKEN);
      const closed = await sock.closed;
      assertEquals(closed.code, 1011);
    });
  } finally {
    server.child.kill("SIGTERM");
    await server.child.status;
    await Deno.remove(dir, { recursive: true });
  }
});
