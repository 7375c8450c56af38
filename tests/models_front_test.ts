/**
 * The front of a server of several models (lib/http/models_front.ts), on real servers
 * (`main.ts serve` with several --model, CPU engine) as child processes: a path no model's
 * app serves loads nothing; /health keeps load errors from callers without a key; the
 * --max-keep-alive cap; each key's keep_alive is its own; and the 503 of a load that finds no
 * room names what holds the memory and, where waiting will not help, does not ask to retry.
 */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { compatPath } from "./harness/compat.ts";
import { spawnCpuServer } from "./_serve_child.ts";
import { assertRefusesInvalidUtf8, invalidUtf8Completion } from "./_http_harness.ts";
import { HIDDEN_LOAD_ERROR } from "../lib/http/models_health_routes.ts";

const A = "stories260K-q4_1";
const B = "stories260K-q5_1";
const C = "tinyllama-like-q4_0";
const BROKEN = "broken";
/** Holds any two of A, B and C, never all three (as in serve_models_test.ts). */
const BUDGET = 17 * 2 ** 20;
const HOUR = 3_600_000;

type Health = Record<
  string,
  { phase: string; bytes?: number; keep_alive?: string; expires_at?: string; last_error?: string }
>;

function client(base: string) {
  const bearer = (key?: string): Record<string, string> =>
    key === undefined ? {} : { authorization: `Bearer ${key}` };
  const complete = async (model: string, extra: Record<string, unknown> = {}, key?: string) => {
    const res = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...bearer(key) },
      body: JSON.stringify({ model, prompt: "Once", max_tokens: 2, temperature: 0, ...extra }),
    });
    return { status: res.status, headers: res.headers, body: await res.json() };
  };
  const health = async (key?: string): Promise<Health> =>
    (await (await fetch(`${base}/health`, { headers: bearer(key) })).json()).models;
  const loads = async (model: string, key?: string) => {
    const body = await (await fetch(`${base}/metrics`, { headers: bearer(key) })).text();
    const line = body.split("\n").find((l) =>
      l.startsWith(`llm_model_loads_total{model="${model}"}`)
    );
    if (line === undefined) throw new Error(`no llm_model_loads_total for ${model} in /metrics`);
    return Number(line.split(" ").pop());
  };
  const until = async (model: string, phase: string, key?: string) => {
    const deadline = Date.now() + 10_000;
    while ((await health(key))[model]?.phase !== phase && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20));
    }
    assertEquals((await health(key))[model]?.phase, phase);
  };
  return { complete, health, loads, until };
}

Deno.test("a path no model's app serves gets its 404 or 405 without a model being loaded", async () => {
  const server = await spawnCpuServer(["--model", compatPath(A), "--model", compatPath(B)]);
  const { health, loads } = client(server.base);
  try {
    const asks: [string, string, number, string][] = [
      ["GET", "/favicon.ico", 404, "No route for GET /favicon.ico"],
      ["HEAD", "/favicon.ico", 404, ""],
      ["GET", "/nonexistent", 404, "No route for GET /nonexistent"],
      ["POST", "/v1/nonexistent", 404, "No route for POST /v1/nonexistent"],
      ["GET", "/v1/completions", 405, "/v1/completions does not take GET; use POST"],
    ];
    for (const [method, path, status, message] of asks) {
      const res = await fetch(server.base + path, { method });
      assertEquals(res.status, status, `${method} ${path}`);
      if (method === "HEAD") continue;
      const err = (await res.json()).error;
      assertEquals(err.message, message);
      if (status === 405) assertEquals(res.headers.get("allow"), "POST");
    }
    assertEquals(Object.values(await health()).map((m) => m.phase), ["unloaded", "unloaded"]);
    assertEquals([await loads(A), await loads(B)], [0, 0]);
    // A route of the models' apps (the playground) does load the default model: the same
    // observation sees a load when there is one.
    const page = await fetch(server.base + "/");
    assertEquals(page.status, 200);
    await page.body?.cancel();
    assertEquals([await loads(A), await loads(B)], [1, 0]);
  } finally {
    server.child.kill("SIGTERM");
    await server.child.status;
  }
  const log = await server.log();
  // The front logs it as a server of one model does: the route label bounded, the path named.
  assert(/ GET unmatched path=\/favicon\.ico 404 code=not_found /.test(log), log);
});

Deno.test("/health shows a load error only to a caller with an API key", async () => {
  const dir = await Deno.makeTempDir({ prefix: "models_front_test_" });
  const whole = await Deno.readFile(compatPath(A));
  await Deno.writeFile(`${dir}/${BROKEN}.gguf`, whole.subarray(0, whole.length >> 1));
  const server = await spawnCpuServer([
    "--api-key",
    "key-one-1",
    "--model",
    compatPath(A),
    "--model",
    `${dir}/${BROKEN}.gguf`,
  ]);
  const { complete, health } = client(server.base);
  try {
    const failed = await complete(BROKEN, {}, "key-one-1");
    assertEquals([failed.status, failed.body.error.code], [503, "model_load_failed"]);
    // The key holder was told the detail, with the file's path.
    assertStringIncludes(failed.body.error.message, `${dir}/${BROKEN}.gguf`);
    const anonymous = await health();
    assertEquals(anonymous[BROKEN]!.phase, "unloaded");
    assertEquals(anonymous[BROKEN]!.last_error, HIDDEN_LOAD_ERROR);
    assertEquals(JSON.stringify(anonymous).includes(dir), false);
    assertEquals((await health("wrong"))[BROKEN]!.last_error, HIDDEN_LOAD_ERROR);
    assertEquals((await health("key-one-1"))[BROKEN]!.last_error, failed.body.error.message);
  } finally {
    server.child.kill("SIGTERM");
    await server.child.status;
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test('--max-keep-alive 1h: keep_alive -1 and "100000h" get an hour; one key\'s keep_alive 0 leaves what another asked to keep', async () => {
  const server = await spawnCpuServer([
    "--api-key",
    "key-one-1",
    "--api-key",
    "key-two-2",
    "--max-keep-alive",
    "1h",
    "--model",
    compatPath(A),
    "--model",
    compatPath(B),
  ]);
  const { complete, health, until } = client(server.base);
  try {
    for (const [model, asked] of [[A, -1], [B, "100000h"]] as const) {
      const t0 = Date.now();
      assertEquals((await complete(model, { keep_alive: asked }, "key-one-1")).status, 200);
      const h = (await health("key-one-1"))[model]!;
      assertEquals([h.phase, h.keep_alive], ["loaded", "1h"], `${model} ${asked}`);
      const expires = Date.parse(h.expires_at!);
      assert(expires >= t0 + HOUR - 1000 && expires <= Date.now() + HOUR, h.expires_at);
    }
    // k2 asks A unloaded at once: only its own wish is shortened, k1's hour stands.
    assertEquals((await complete(A, { keep_alive: 0 }, "key-two-2")).status, 200);
    assertEquals((await health("key-one-1"))[A]!.phase, "loaded");
    assertEquals((await health("key-one-1"))[A]!.keep_alive, "1h");
    // k1 takes its own back: nobody wants A kept, and it is unloaded.
    assertEquals((await complete(A, { keep_alive: 0 }, "key-one-1")).status, 200);
    await until(A, "unloaded", "key-one-1");
    assertEquals((await health("key-one-1"))[B]!.phase, "loaded");
  } finally {
    server.child.kill("SIGTERM");
    await server.child.status;
  }
});

Deno.test("no room because models are kept forever (--max-keep-alive -1): the 503 names them, their sizes and keep-alive, and gives no Retry-After", async () => {
  const server = await spawnCpuServer([
    "--api-key",
    "key-one-1",
    "--api-key",
    "key-two-2",
    "--max-keep-alive",
    "-1",
    "--memory-budget",
    String(BUDGET),
    "--model",
    compatPath(A),
    "--model",
    compatPath(B),
    "--model",
    compatPath(C),
  ]);
  const { complete, health } = client(server.base);
  try {
    assertEquals((await complete(A, { keep_alive: -1 }, "key-one-1")).status, 200);
    assertEquals((await complete(B, { keep_alive: -1 }, "key-one-1")).status, 200);
    const h = await health("key-one-1");
    assertEquals([h[A]!.keep_alive, h[A]!.expires_at], ["forever", "never"]);
    const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
    const refused = await complete(C, {}, "key-two-2");
    assertEquals([refused.status, refused.body.error.code], [503, "insufficient_memory"]);
    assertEquals(refused.headers.get("retry-after"), null);
    const message: string = refused.body.error.message;
    for (const m of [A, B]) {
      assertStringIncludes(
        message,
        `${m} ${mib(h[m]!.bytes!)} (idle; kept forever (keep_alive -1))`,
      );
    }
    assertStringIncludes(message, "waiting will not help");
    assertEquals(message.includes("retry"), false, message);
    // k2 cannot unpin what k1 pinned; k1 can.
    assertEquals((await complete(A, { keep_alive: 0 }, "key-two-2")).status, 200);
    assertEquals((await complete(C, {}, "key-two-2")).status, 503);
    assertEquals((await complete(A, { keep_alive: 0 }, "key-one-1")).status, 200);
    const served = await complete(C, {}, "key-two-2");
    assertEquals(served.status, 200, JSON.stringify(served.body));
    assertEquals(
      Object.fromEntries(Object.entries(await health("key-one-1")).map(([k, v]) => [k, v.phase])),
      { [A]: "unloaded", [B]: "loaded", [C]: "loaded" },
    );
  } finally {
    server.child.kill("SIGTERM");
    await server.child.status;
  }
});

Deno.test("a body that is not UTF-8 gets a 400 from a server of several models, sent whole or chunked", async () => {
  const server = await spawnCpuServer(["--model", compatPath(A), "--model", compatPath(B)]);
  try {
    const { body, ...init } = invalidUtf8Completion(A);
    await assertRefusesInvalidUtf8(
      await fetch(`${server.base}/v1/completions`, { ...init, body }),
    );
    // Chunked (no Content-Length), as hono's body limit buffers it: the same answer.
    await assertRefusesInvalidUtf8(
      await fetch(`${server.base}/v1/completions`, {
        ...init,
        body: ReadableStream.from([body as Uint8Array]),
      }),
    );
    // Refused before any model: none was loaded for it.
    const { loads } = client(server.base);
    assertEquals(await loads(A), 0);
  } finally {
    server.child.kill("SIGTERM");
    await server.child.status;
  }
});
