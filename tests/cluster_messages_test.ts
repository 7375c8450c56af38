import { assertEquals, assertMatch, assertThrows } from "@std/assert";
import {
  decodeMessage,
  encodeMessage,
  ReplicaRequest,
  StreamFrame,
} from "../lib/cluster/messages.ts";
import { parseNatsUrl } from "../lib/cluster/nats_connection.ts";

const bytes = (v: unknown) =>
  new TextEncoder().encode(typeof v === "string" ? v : JSON.stringify(v));

Deno.test("a token frame round-trips, a logprob of -Infinity included (JSON writes it as null)", () => {
  const frame = {
    type: "event",
    stream: "s-1",
    seq: 3,
    event: { type: "token", text: "hi", ids: [5, 6], logprob: -Infinity },
  };
  const back = decodeMessage(StreamFrame, encodeMessage(frame));
  assertEquals(back, { ok: true, value: frame });
});

Deno.test("malformed messages from the bus are refused with what was wrong", () => {
  const notJson = decodeMessage(ReplicaRequest, bytes("{nope"));
  assertEquals(notJson.ok, false);
  if (!notJson.ok) assertMatch(notJson.error, /not JSON/);
  const unknown = decodeMessage(ReplicaRequest, bytes({ type: "reboot" }));
  assertEquals(unknown.ok, false);
  const badPrompt = decodeMessage(
    ReplicaRequest,
    bytes({
      type: "generate",
      stream: "s",
      replyTo: "r",
      prompt: [1, -2],
      maxTokens: 4,
      sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 },
      stop: [],
      priority: "interactive",
      requestId: "x",
      logprobs: false,
      credit: 8,
    }),
  );
  assertEquals(badPrompt.ok, false);
  if (!badPrompt.ok) assertMatch(badPrompt.error, /prompt\.1/);
  const credit = decodeMessage(ReplicaRequest, bytes({ type: "credit", stream: "s", upTo: 64 }));
  assertEquals(credit, { ok: true, value: { type: "credit", stream: "s", upTo: 64 } });
});

Deno.test("NATS URLs: credentials become options, servers keep host and port", () => {
  assertEquals(parseNatsUrl("nats://u:p%40ss@10.0.0.1:4333"), {
    servers: ["nats://10.0.0.1:4333"],
    user: "u",
    pass: "p@ss",
  });
  assertEquals(parseNatsUrl("nats://s3cr3t@localhost"), {
    servers: ["nats://localhost:4222"],
    token: "s3cr3t",
  });
  assertEquals(parseNatsUrl("a:1, b:2").servers, ["nats://a:1", "nats://b:2"]);
  assertThrows(() => parseNatsUrl("http://x:1"), Error, "must be nats:// or tls://");
  assertThrows(() => parseNatsUrl(""), Error, "names no server");
});

const HEARTBEAT = {
  type: "heartbeat",
  replica: "replica-1",
  beat: 1,
  intervalMs: 250,
  stalledMs: 0,
  draining: false,
  model: "m",
  load: {
    running: 0,
    waiting: 0,
    maxRunning: 1,
    maxWaiting: 1,
    kvBlocksUsed: 0,
    kvBlocksTotal: 1,
    streams: 0,
    prefixQueryTokens: 0,
    prefixHitTokens: 0,
  },
  prefix: { blockSize: 16, hashes: [1, 2] },
  streamIds: ["s-1"],
};

Deno.test("decodeMessage() refuses ids no subject can hold, on every message that carries one", async () => {
  const { ReplicaAnnouncement } = await import("../lib/cluster/messages.ts");
  assertEquals(decodeMessage(ReplicaAnnouncement, bytes(HEARTBEAT)).ok, true);
  for (const bad of ["bad id", "a.b", "*", ">", "", "x".repeat(129), "é"]) {
    for (
      const [schema, msg] of [
        [ReplicaAnnouncement, { ...HEARTBEAT, replica: bad }],
        [ReplicaAnnouncement, { ...HEARTBEAT, streamIds: [bad] }],
        [ReplicaAnnouncement, { type: "goodbye", replica: bad }],
        [ReplicaRequest, { type: "credit", stream: bad, upTo: 1 }],
        [ReplicaRequest, { type: "cancel", stream: bad, how: "gone" }],
      ] as const
    ) {
      const r = decodeMessage(schema, bytes(msg));
      assertEquals(r.ok, false, `${JSON.stringify(bad)} was accepted in ${JSON.stringify(msg)}`);
    }
  }
  const generate = (replyTo: string) => ({
    type: "generate",
    stream: "s-1",
    replyTo,
    prompt: [1],
    maxTokens: 1,
    sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 },
    stop: [],
    priority: "interactive",
    requestId: "r",
    logprobs: false,
    credit: 1,
  });
  assertEquals(
    decodeMessage(ReplicaRequest, bytes(generate("llmserve.router.r-1.frames"))).ok,
    true,
  );
  for (const bad of ["bad reply", "a..b", ".a", "a.", "a.*", "a.>", ""]) {
    const r = decodeMessage(ReplicaRequest, bytes(generate(bad)));
    assertEquals(r.ok, false, `replyTo ${JSON.stringify(bad)} was accepted`);
    if (!r.ok) assertMatch(r.error, /replyTo/);
  }
});

Deno.test("decodeMessage() names a few issues of a 1 MB malformed heartbeat, not 100,000", async () => {
  const { ReplicaAnnouncement } = await import("../lib/cluster/messages.ts");
  const hashes = Array(100_000).fill("xxxxxx");
  const data = bytes({ ...HEARTBEAT, prefix: { blockSize: 16, hashes } });
  const r = decodeMessage(ReplicaAnnouncement, data);
  assertEquals(r.ok, false);
  if (!r.ok) {
    assertMatch(r.error, /prefix\.hashes/);
    // It was 33 MB: one issue per element.
    assertEquals(r.error.length < 1000, true, `${r.error.length} characters`);
  }
});

Deno.test("cappedLog() cuts long lines and lets 10 through per window, counting the rest", async () => {
  const { cappedLog } = await import("../lib/cluster/nats_connection.ts");
  const lines: string[] = [];
  let t = 0;
  const log = cappedLog((l) => lines.push(l), { now: () => t, perWindow: 10, windowMs: 1000 });
  for (let i = 0; i < 25; i++) log(`bad ${i} ` + "x".repeat(1000));
  assertEquals(lines.length, 10);
  assertEquals(lines.every((l) => l.length < 400), true);
  t = 1000;
  log("next");
  assertEquals(lines.at(-1), "next (15 similar lines suppressed before this one)");
});

Deno.test("guarded() reports a throwing handler instead of passing the throw to the reader", async () => {
  const { guarded } = await import("../lib/cluster/nats_connection.ts");
  const seen: string[] = [];
  const errors: string[] = [];
  const cb = guarded((m) => {
    if (m.subject === "boom") throw new Error("publish failed");
    seen.push(m.subject);
  }, (e) => errors.push((e as Error).message));
  const msg = (subject: string) => ({ subject }) as Parameters<typeof cb>[1];
  cb(null, msg("boom"));
  cb(null, msg("after"));
  assertEquals(seen, ["after"]);
  assertEquals(errors, ["publish failed"]);
});

Deno.test("a generate request carries the logit controls, the delivered-token count and top_logprobs; a token frame its alternatives", () => {
  const generate = {
    type: "generate",
    stream: "s-1",
    replyTo: "llmserve.router.r-1.frames",
    prompt: [1, 7, 7],
    maxTokens: 4,
    sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 },
    stop: [],
    controls: {
      logitBias: [[3, -100]],
      presencePenalty: 0.5,
      frequencyPenalty: 0.25,
      repetitionPenalty: 1.3,
      repeatLastN: 64,
      minTokens: 2,
    },
    generated: 2,
    topLogprobs: 5,
    priority: "interactive",
    requestId: "r",
    logprobs: true,
    credit: 1,
  };
  assertEquals(decodeMessage(ReplicaRequest, encodeMessage(generate)), {
    ok: true,
    value: generate,
  });
  const bad = decodeMessage(
    ReplicaRequest,
    bytes({ ...generate, controls: { repetitionPenalty: 0 } }),
  );
  assertEquals(bad.ok, false);
  // A replica checks the floats as the f32 its engine holds: 1e-300 is 0 there, 1e39 infinite.
  const tiny = decodeMessage(
    ReplicaRequest,
    bytes({ ...generate, controls: { repetitionPenalty: 1e-300 } }),
  );
  assertEquals(tiny.ok, false);
  if (!tiny.ok) assertMatch(tiny.error, /repetitionPenalty.*>= ?0\.000001.*1e-300 rounds to 0/);
  const hot = decodeMessage(
    ReplicaRequest,
    bytes({ ...generate, sampling: { ...generate.sampling, temperature: 1e39 } }),
  );
  assertEquals(hot.ok, false);
  if (!hot.ok) {
    assertMatch(hot.error, /temperature.*finite number as a 32-bit float.*rounds to Infinity/);
  }
  const frame = {
    type: "event",
    stream: "s-1",
    seq: 0,
    event: {
      type: "token",
      text: "a",
      ids: [5],
      logprob: -0.5,
      top: { ids: [5, 9], logprobs: [-0.5, -1.5] },
    },
  };
  assertEquals(decodeMessage(StreamFrame, encodeMessage(frame)), { ok: true, value: frame });
});

Deno.test("a generate message carries the output constraint and how many prompt ids the grammar replays", () => {
  const msg = {
    type: "generate",
    stream: "s",
    replyTo: "r",
    prompt: [1, 5, 6],
    maxTokens: 4,
    sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 },
    stop: [],
    priority: "interactive",
    requestId: "x",
    logprobs: false,
    credit: 8,
    constraint: { type: "json_schema", schema: '{"type":"integer"}' },
    constraintReplay: 2,
  };
  assertEquals(decodeMessage(ReplicaRequest, bytes(msg)), { ok: true, value: msg });
  const bad = decodeMessage(ReplicaRequest, bytes({ ...msg, constraint: { type: "regex" } }));
  assertEquals(bad.ok, false);
});

Deno.test("a replica's invalid_request error (a schema it could not compile) reaches the router as such", () => {
  const frame = {
    type: "event",
    stream: "s-2",
    seq: 0,
    event: { type: "error", code: "invalid_request", message: "Cannot compile the grammar: x" },
  };
  assertEquals(decodeMessage(StreamFrame, encodeMessage(frame)), { ok: true, value: frame });
});

Deno.test("a heartbeat of several models lists each with its phase; their hashes are bounded all together", async () => {
  const { ReplicaAnnouncement, servedModels } = await import("../lib/cluster/messages.ts");
  const models = [
    { name: "a", modelId: "1-aa-ctx128", phase: "loaded", running: 1, waiting: 0, hashes: [5] },
    { name: "b", phase: "unloaded" },
  ];
  const r = decodeMessage(ReplicaAnnouncement, bytes({ ...HEARTBEAT, models }));
  assertEquals(r.ok, true);
  if (r.ok && r.value.type === "heartbeat") assertEquals(servedModels(r.value), models);
  // A beat without the list is one model, loaded, with the beat's own figures.
  const one = decodeMessage(ReplicaAnnouncement, bytes(HEARTBEAT));
  if (one.ok && one.value.type === "heartbeat") {
    assertEquals(servedModels(one.value), [{
      name: "m",
      phase: "loaded",
      running: 0,
      waiting: 0,
      hashes: [1, 2],
    }]);
  }
  // 8192 hashes in each of three models: refused before a single element is checked.
  const many = [0, 1, 2].map((i) => ({
    name: `m${i}`,
    phase: "loaded",
    hashes: Array(8192).fill("x"),
  }));
  const bad = decodeMessage(ReplicaAnnouncement, bytes({ ...HEARTBEAT, models: many }));
  assertEquals(bad.ok, false);
  if (!bad.ok) {
    assertMatch(bad.error, /more than 8192 hashes in all models \(24576\)/);
    assertEquals(bad.error.length < 1000, true, `${bad.error.length} characters`);
  }
  const phase = decodeMessage(
    ReplicaAnnouncement,
    bytes({ ...HEARTBEAT, models: [{ name: "a", phase: "warm" }] }),
  );
  assertEquals(phase.ok, false);
});

Deno.test("an embed request and its embedding frame round-trip; a vector longer than any model's, an empty input or a subject-breaking id are refused", () => {
  const embed = {
    type: "embed",
    stream: "e-1",
    replyTo: "llmserve.router.r-1.frames",
    input: [1, 2, 3],
    priority: "batch",
    requestId: "embed-1",
    model: "m",
  };
  assertEquals(decodeMessage(ReplicaRequest, encodeMessage(embed)), { ok: true, value: embed });
  for (const bad of [{ input: [] }, { input: [1, -1] }, { stream: "e.1" }, { replyTo: "a b" }]) {
    const r = decodeMessage(ReplicaRequest, bytes({ ...embed, ...bad }));
    assertEquals(r.ok, false, JSON.stringify(bad));
  }
  const frame = {
    type: "embedding",
    stream: "e-1",
    outcome: { kind: "vector", data: btoa("\0\0\x80?") },
  };
  assertEquals(decodeMessage(StreamFrame, encodeMessage(frame)), { ok: true, value: frame });
  // 65,536 float32 values at most (349,528 base64 characters): one more is refused unread.
  const values = (n: number) => ({
    ...frame,
    outcome: { kind: "vector", data: "A".repeat(Math.ceil((n * 4) / 3) * 4) },
  });
  assertEquals(decodeMessage(StreamFrame, encodeMessage(values(65_536))).ok, true);
  assertEquals(decodeMessage(StreamFrame, encodeMessage(values(65_537))).ok, false);
  const unsupported = { ...frame, outcome: { kind: "unsupported", message: "no hidden states" } };
  assertEquals(decodeMessage(StreamFrame, encodeMessage(unsupported)), {
    ok: true,
    value: unsupported,
  });
});
