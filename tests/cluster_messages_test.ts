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
