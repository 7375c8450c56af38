/**
 * Reliability of the real server (main.ts serve, CPU engine, stories260K) under bad input,
 * overload, churn, injected executor faults and a drain. Each test starts its own server as a
 * child process on a loopback port, and checks every generation that completes against the
 * CPU reference run alone (lib/reference/reference_generate.ts).
 */
import { assert, assertEquals, assertGreater, assertLessOrEqual, assertMatch } from "@std/assert";
import { metricValue, type ServerProcess, startServer } from "./harness/server_process.ts";
import { type FuzzBody, malformedHttpBodies, malformedWsFrames, seeded } from "./_fuzz_cases.ts";
import { modelFile } from "./harness/model_files.ts";
import { FrameClient, type GenParams, MODEL_NAME, Reference } from "./_reliability_harness.ts";

const reference = Reference.load();

async function serve(
  extra: string[] = [],
  env: Record<string, string> = {},
): Promise<ServerProcess> {
  return await startServer({
    args: [
      "--model",
      modelFile(MODEL_NAME),
      "--backend",
      "reference",
      "--kv-memory",
      "4MiB",
      ...extra,
    ],
    env,
  });
}

/** Stops the server with SIGTERM and checks it exits 0. */
async function shutdown(server: ServerProcess): Promise<string> {
  const { code, log } = await server.stop("SIGTERM");
  assertEquals(code, 0, `server exit code; its log:\n${log}`);
  return log;
}

async function metrics(base: string): Promise<string> {
  return await (await fetch(`${base}/metrics`)).text();
}

/**
 * Polls /metrics until `series` reads `want` (what is left in flight settles asynchronously).
 * `timeoutMs` is a hang guard, not a speed bound.
 */
async function metricSettles(
  base: string,
  series: string,
  want: number,
  timeoutMs = 60_000,
): Promise<void> {
  const end = performance.now() + timeoutMs;
  let last: number | undefined;
  while (performance.now() < end) {
    last = metricValue(await metrics(base), series);
    if (last === want) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`${series} stayed at ${last}, expected ${want}`);
}

const PROMPTS = [
  "Once upon a time",
  "Tom and his dog",
  "The little cat",
  "Lily went to the park",
  "One day a bird",
];

/** Sends one WebSocket text frame with arbitrary payload bytes on a fresh raw connection. */
async function rawFrame(
  wsUrl: string,
  payload: Uint8Array,
): Promise<{ eof: boolean; closeCode?: number }> {
  const u = new URL(wsUrl);
  const conn = await Deno.connect({ hostname: u.hostname, port: Number(u.port) });
  try {
    const enc = new TextEncoder();
    await conn.write(enc.encode(
      `GET ${u.pathname} HTTP/1.1\r\nHost: ${u.host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
        `Sec-WebSocket-Key: ${btoa("0123456789abcdef")}\r\nSec-WebSocket-Version: 13\r\n\r\n`,
    ));
    const buf = new Uint8Array(65536);
    let head = "";
    while (!head.includes("\r\n\r\n")) {
      const n = await conn.read(buf);
      if (n === null) throw new Error("closed during the handshake");
      head += new TextDecoder().decode(buf.subarray(0, n));
    }
    assertMatch(head, /^HTTP\/1\.1 101/);
    const mask = [0x12, 0x34, 0x56, 0x78];
    const frame = new Uint8Array(6 + payload.length);
    frame[0] = 0x81; // FIN, text
    frame[1] = 0x80 | payload.length; // masked, short length
    frame.set(mask, 2);
    payload.forEach((b, i) => (frame[6 + i] = b ^ mask[i % 4]!));
    await conn.write(frame);
    const n = await conn.read(buf);
    if (n === null) return { eof: true };
    // A close frame (opcode 8) carries its status code in the first two payload bytes.
    if ((buf[0]! & 0x0f) === 8 && n >= 4) {
      return { eof: false, closeCode: (buf[2]! << 8) | buf[3]! };
    }
    return { eof: false };
  } finally {
    try {
      conn.close();
    } catch { /* closed by the server */ }
  }
}

const WS_ERROR_CODES = new Set([
  "invalid_json",
  "invalid_request",
  "unknown_type",
  "unsupported_frame",
  "frame_too_large",
  "unknown_id",
]);
const HTTP_ERROR_CODES = new Set([
  "invalid_json",
  "invalid_request",
  "payload_too_large",
  "context_length_exceeded",
  "model_not_found",
]);

Deno.test("fuzzing: thousands of malformed frames and bodies each get a clear error, and the server then generates the reference tokens", async () => {
  const ref = await reference;
  const server = await serve();
  try {
    const rand = seeded(20261130);
    // WebSocket: generated frames, binary frames and oversized frames, all on one socket.
    const frames = malformedWsFrames(rand, 2500);
    const extras = [
      ...Array.from(
        { length: 20 },
        (_, i) => ({ kind: "binary", data: new Uint8Array([i, 1, 2, 3]) }),
      ),
      ...Array.from(
        { length: 5 },
        (_, i) => ({
          kind: "oversized",
          data: `{"type":"generate","id":"big${i}","prompt":"${"a".repeat(300_000)}"}`,
        }),
      ),
    ];
    const all = [...frames, ...extras];
    const ws = await FrameClient.open(server.wsUrl);
    for (const f of all) ws.send(f.data);
    await ws.until(() => ws.frames.length >= all.length, `${all.length} error frames`, 30_000);
    // Nothing else may arrive. The server answers frames in order, so once a final probe's
    // answer is in (a generate frame without a prompt: an error naming its id), every answer to
    // the frames before it is too: exactly one each, then the probe's.
    ws.send(JSON.stringify({ type: "generate", id: "final-probe" }));
    await ws.until(
      () => ws.frames.some((f) => f.id === "final-probe"),
      "the probe's answer",
      30_000,
    );
    assertEquals(ws.frames.at(-1)?.id, "final-probe", "nothing after the probe's answer");
    ws.frames.pop();
    if (ws.frames.length !== all.length) {
      const odd = ws.frames.filter((f) => f.type !== "error").slice(0, 5);
      const ids = new Set(ws.frames.filter((f) => f.type !== "error").map((f) => f.id));
      console.log(
        JSON.stringify(odd),
        all.filter((f) => "id" in f && ids.has(f.id)).slice(0, 5).map((
          f,
        ) => [f.kind, String(f.data).slice(0, 200)]),
      );
    }
    assertEquals(ws.frames.length, all.length, "one answer per malformed frame");
    all.forEach((f, i) => {
      const answer = ws.frames[i]!;
      const what = `frame ${i} (${f.kind}): ${
        typeof f.data === "string" ? f.data.slice(0, 80) : "binary"
      } -> ${JSON.stringify(answer).slice(0, 200)}`;
      assertEquals(answer.type, "error", what);
      assert(WS_ERROR_CODES.has(answer.code), what);
      assertGreater(String(answer.message).length, 15, what);
      if ("id" in f && f.id !== undefined) assertEquals(answer.id, f.id, what);
    });
    assertEquals(ws.ws.readyState, WebSocket.OPEN, "the socket survives malformed frames");

    // Invalid UTF-8 in a text frame breaks the WebSocket protocol itself: the connection is
    // failed (closed), and the server goes on serving everyone else.
    const enc = new TextEncoder();
    const badUtf8 = [[0xff], [0xc0, 0xaf], [0xed, 0xa0, 0x80], [0xe2, 0x82]];
    for (let i = 0; i < 12; i++) {
      const bad = badUtf8[i % badUtf8.length]!;
      const payload = new Uint8Array([
        ...enc.encode(`{"type":"generate","id":"u${i}","prompt":"`),
        ...bad,
        ...enc.encode(`"}`),
      ]);
      const r = await rawFrame(server.wsUrl, payload);
      assert(
        r.eof || r.closeCode === 1007,
        `invalid UTF-8 frame ${i} should fail the connection, got ${JSON.stringify(r)}`,
      );
    }
    // The same frame with valid UTF-8 is answered normally (so the raw framing above is right).
    const control = await rawFrame(server.wsUrl, enc.encode(`{"type":"cancel","id":"nope"}`));
    assertEquals(control, { eof: false });

    // HTTP: generated bodies, eight at a time, plus oversized ones.
    const bodies: FuzzBody[] = [
      ...malformedHttpBodies(rand, 1200),
      ...Array.from(
        { length: 3 },
        () => ({
          kind: "oversized",
          path: "/v1/completions" as const,
          body: `{"prompt":"${"a".repeat(1_100_000)}"}`,
        }),
      ),
    ];
    let next = 0;
    const statuses = new Map<number, number>();
    await Promise.all(Array.from({ length: 8 }, async () => {
      for (let i = next++; i < bodies.length; i = next++) {
        const b = bodies[i]!;
        const res = await fetch(`${server.base}${b.path}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: b.body,
        });
        const text = await res.text();
        const what = `body ${i} (${b.kind}) ${
          typeof b.body === "string" ? b.body.slice(0, 80) : "bytes"
        } -> ${res.status} ${text.slice(0, 200)}`;
        statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
        assert(res.status === 400 || res.status === 404 || res.status === 413, what);
        const err = JSON.parse(text).error;
        assert(HTTP_ERROR_CODES.has(err.code), what);
        assertGreater(String(err.message).length, 15, what);
        assert(typeof err.type === "string" && "param" in err, what);
      }
    }));
    console.log(
      `fuzzed ${all.length} WebSocket frames, 12 invalid-UTF-8 frames and ${bodies.length} HTTP bodies; HTTP statuses ${
        JSON.stringify(Object.fromEntries(statuses))
      }`,
    );

    // Afterwards well-formed requests still get exactly the reference tokens.
    const greedy: GenParams = { prompt: "Once upon a time", max_tokens: 40, temperature: 0 };
    const sampled: GenParams = {
      prompt: "Tom and his dog",
      max_tokens: 40,
      temperature: 0.8,
      top_p: 0.9,
      seed: 7,
    };
    ws.generate("ok-greedy", greedy);
    ws.generate("ok-sampled", sampled);
    await ws.finished(["ok-greedy", "ok-sampled"]);
    assertEquals(ws.tokens("ok-greedy"), await ref.tokens(greedy));
    assertEquals(ws.tokens("ok-sampled"), await ref.tokens(sampled));
    const res = await fetch(`${server.base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        prompt: greedy.prompt,
        max_tokens: greedy.max_tokens,
        temperature: 0,
      }),
    });
    assertEquals((await res.json()).choices[0].text, ref.text(await ref.tokens(greedy)));
    ws.close();
    await metricSettles(server.base, "llm_kv_blocks_used", 0);
  } finally {
    await shutdown(server);
  }
});

Deno.test("overload at 4x capacity: the queue stays bounded, the excess gets 503/overloaded with Retry-After, the admitted complete with the reference tokens", async () => {
  const ref = await reference;
  // Capacity: 2 running + 2 waiting.
  const server = await serve(["--max-running", "2", "--max-waiting", "2"]);
  try {
    let shed = 0, admitted = 0;
    for (let round = 0; round < 3; round++) {
      const params = (i: number): GenParams => ({
        prompt: PROMPTS[i % PROMPTS.length]!,
        max_tokens: 96,
        temperature: 0,
      });
      // 8 over one socket, sent back to back, and 8 over HTTP at the same moment: 16 = 4 x 4.
      const ws = await FrameClient.open(server.wsUrl);
      const ids = Array.from({ length: 8 }, (_, i) => `r${round}-${i}`);
      ids.forEach((id, i) => ws.generate(id, params(i)));
      const http = await Promise.all(Array.from({ length: 8 }, async (_, i) => {
        const p = params(i + 3);
        const res = await fetch(`${server.base}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ prompt: p.prompt, max_tokens: p.max_tokens, temperature: 0 }),
        });
        return { p, res, body: await res.json() };
      }));
      await ws.finished(ids);
      // The server's own order of events on the socket: never more than 4 of its generations
      // live at once (running + waiting).
      let live = 0, maxLive = 0;
      for (const f of ws.frames) {
        if (f.type === "started") maxLive = Math.max(maxLive, ++live);
        if (f.type === "done") live--;
      }
      assertLessOrEqual(maxLive, 4);
      for (const [i, id] of ids.entries()) {
        const fin = ws.final(id)!;
        if (fin.type === "error") {
          assertEquals(fin.code, "overloaded", JSON.stringify(fin));
          assertMatch(fin.message, /waiting/);
          shed++;
        } else {
          assertEquals(fin.finish_reason, "length");
          assertEquals(ws.tokens(id), await ref.tokens(params(i)));
          admitted++;
        }
      }
      for (const { p, res, body } of http) {
        if (res.status === 503) {
          assertEquals(body.error.code, "overloaded");
          assertGreater(Number(res.headers.get("retry-after")), 0);
          shed++;
        } else {
          assertEquals(res.status, 200, JSON.stringify(body));
          assertEquals(body.choices[0].text, ref.text(await ref.tokens(p)));
          admitted++;
        }
      }
      ws.close();
    }
    console.log(
      `overload: ${admitted} admitted and completed, ${shed} shed, of ${admitted + shed}`,
    );
    assertGreater(shed, 16, "most of the excess is shed");
    assertGreater(admitted, 8, "capacity is used");
    const text = await metrics(server.base);
    assertEquals(metricValue(text, 'llm_errors_total{code="overloaded"}'), shed);
    await metricSettles(server.base, "llm_requests_waiting", 0);
    await metricSettles(server.base, "llm_kv_blocks_used", 0);
  } finally {
    await shutdown(server);
  }
});

Deno.test("churn: random cancels and disconnects leave zero KV blocks in use, and every token streamed is the reference's", async () => {
  const ref = await reference;
  const server = await serve(["--max-running", "16"]);
  try {
    const rand = seeded(7);
    const counts = { completed: 0, cancelled: 0, disconnected: 0, httpAborted: 0 };
    const wsWorker = async (w: number) => {
      for (let round = 0; round < 6; round++) {
        const ws = await FrameClient.open(server.wsUrl);
        const ids: string[] = [];
        const params = new Map<string, GenParams>();
        for (let k = 0; k < 5; k++) {
          const id = `w${w}r${round}g${k}`;
          const p: GenParams = rand() < 0.5
            ? {
              prompt: PROMPTS[Math.floor(rand() * PROMPTS.length)]!,
              max_tokens: 8 + Math.floor(rand() * 56),
              temperature: 0,
            }
            : {
              prompt: PROMPTS[Math.floor(rand() * PROMPTS.length)]!,
              max_tokens: 8 + Math.floor(rand() * 56),
              temperature: 0.9,
              seed: Math.floor(rand() * 1e6),
            };
          ids.push(id);
          params.set(id, p);
          ws.generate(id, p);
        }
        const fate = rand();
        await new Promise((r) => setTimeout(r, rand() * 30));
        if (fate < 0.35) {
          for (const id of ids) if (rand() < 0.6) ws.send({ type: "cancel", id });
        } else if (fate < 0.65) {
          ws.close(); // the client goes away mid-generation
          counts.disconnected += ids.filter((id) => !ws.final(id)).length;
          for (const id of ids) {
            const want = await ref.tokens(params.get(id)!);
            assertEquals(ws.tokens(id), want.slice(0, ws.tokens(id).length), `prefix of ${id}`);
          }
          continue;
        }
        await ws.finished(ids);
        for (const id of ids) {
          const fin = ws.final(id)!;
          // A cancel racing the end may find the id already gone (unknown_id): either is fine.
          const want = await ref.tokens(params.get(id)!);
          if (fin.type === "done" && fin.finish_reason !== "cancelled") {
            assertEquals(ws.tokens(id), want, id);
            counts.completed++;
          } else {
            assertEquals(fin.finish_reason, "cancelled", JSON.stringify(fin));
            assertEquals(ws.tokens(id), want.slice(0, ws.tokens(id).length), `prefix of ${id}`);
            counts.cancelled++;
          }
        }
        ws.close();
      }
    };
    const httpWorker = async () => {
      for (let k = 0; k < 10; k++) {
        const ctrl = new AbortController();
        const res = await fetch(`${server.base}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({
            prompt: "Once upon a time",
            max_tokens: 200,
            temperature: 0,
            stream: true,
          }),
          signal: ctrl.signal,
        });
        const reader = res.body!.getReader();
        await reader.read();
        ctrl.abort();
        await reader.cancel().catch(() => {});
        counts.httpAborted++;
      }
    };
    await Promise.all([...Array.from({ length: 6 }, (_, w) => wsWorker(w)), httpWorker()]);
    console.log(`churn: ${JSON.stringify(counts)}`);
    assertGreater(counts.completed, 0);
    assertGreater(counts.cancelled + counts.disconnected, 0);
    await metricSettles(server.base, "llm_kv_blocks_used", 0);
    await metricSettles(server.base, "llm_requests_running", 0);
    await metricSettles(server.base, "llm_inflight_generations", 0);
    // The pool is whole again: a generation runs as before.
    const ws = await FrameClient.open(server.wsUrl);
    const p: GenParams = { prompt: "The little cat", max_tokens: 30, temperature: 0 };
    ws.generate("after", p);
    await ws.finished(["after"]);
    assertEquals(ws.tokens("after"), await ref.tokens(p));
    ws.close();
  } finally {
    await shutdown(server);
  }
});

Deno.test("faults: an executor killed mid-step and a lost device are recovered, and every in-flight request completes with its reference tokens", async () => {
  const ref = await reference;
  const server = await serve([], { LLMSERVE_FAULT_STEPS: "15,35:device-lost,55" });
  try {
    const ws = await FrameClient.open(server.wsUrl);
    const params = Array.from(
      { length: 12 },
      (_, i): GenParams =>
        i % 2 === 0 ? { prompt: PROMPTS[i % PROMPTS.length]!, max_tokens: 64, temperature: 0 } : {
          prompt: PROMPTS[i % PROMPTS.length]!,
          max_tokens: 64,
          temperature: 0.8,
          top_p: 0.95,
          seed: 100 + i,
        },
    );
    params.forEach((p, i) => ws.generate(`f${i}`, p));
    await ws.finished(params.map((_, i) => `f${i}`), 30_000);
    for (const [i, p] of params.entries()) {
      assertEquals(ws.final(`f${i}`)!.type, "done", JSON.stringify(ws.final(`f${i}`)));
      assertEquals(ws.tokens(`f${i}`), await ref.tokens(p), `f${i}`);
    }
    ws.close();
    const text = await metrics(server.base);
    // Three injected faults, three restarts (not one per step lost with the dead engine).
    assertEquals(metricValue(text, "llm_executor_restarts_total"), 3);
    assertEquals(metricValue(text, "llm_executor_healthy"), 1);
    await metricSettles(server.base, "llm_kv_blocks_used", 0);
  } finally {
    const log = await shutdown(server);
    assertEquals(log.match(/injected fault/g)?.length ?? 0, 3, log);
  }
});

Deno.test("drain: SIGTERM under load lets every admitted generation finish, refuses new ones with 503, and exits 0", async () => {
  const ref = await reference;
  const server = await serve(["--drain-timeout", "30"]);
  let drained = false;
  try {
    const ws = await FrameClient.open(server.wsUrl);
    const params = Array.from(
      { length: 8 },
      (_, i): GenParams => ({
        prompt: PROMPTS[i % PROMPTS.length]!,
        max_tokens: 200,
        temperature: 0,
      }),
    );
    const ids = params.map((_, i) => `d${i}`);
    params.forEach((p, i) => ws.generate(ids[i]!, p));
    await ws.until(() => ids.every((id) => ws.tokens(id).length > 0), "first tokens of all");
    const exited = server.stop("SIGTERM");
    drained = true;
    // New work while draining: refused, over both APIs, until the listener goes away.
    let refused = 0, readyRefused = 0;
    let lateSent = false;
    while (ids.some((id) => !ws.final(id))) {
      try {
        const res = await fetch(`${server.base}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ prompt: "Once upon a time", max_tokens: 4 }),
        });
        const body = await res.json();
        assertEquals(res.status, 503, JSON.stringify(body));
        assertEquals(body.error.code, "draining");
        assertGreater(Number(res.headers.get("retry-after")), 0);
        refused++;
        if (!lateSent) {
          ws.generate("late", params[0]!); // the socket stays open while it drains
          lateSent = true;
        }
        if (
          (await fetch(`${server.base}/ready`).then((r) => (r.body?.cancel(), r.status))) === 503
        ) readyRefused++;
      } catch {
        break; // the server closed its listener
      }
      await new Promise((r) => setTimeout(r, 20));
    }
    await ws.finished(lateSent ? [...ids, "late"] : ids, 30_000);
    for (const [i, id] of ids.entries()) {
      assertEquals(ws.final(id)!.finish_reason, "length", id);
      assertEquals(ws.tokens(id), await ref.tokens(params[i]!), id);
    }
    assert(lateSent, "a new request was refused while the admitted ones ran");
    assertEquals(ws.final("late")!.code, "draining", JSON.stringify(ws.final("late")));
    console.log(
      `drain: 8 admitted completed, ${refused} new requests refused with 503, /ready 503 ${readyRefused} times`,
    );
    assertGreater(refused, 0);
    assertGreater(readyRefused, 0);
    const { code, log } = await exited;
    assertEquals(code, 0, log);
    assertMatch(log, /drained: all in-flight generations finished/);
  } finally {
    if (!drained) await shutdown(server);
  }
});
