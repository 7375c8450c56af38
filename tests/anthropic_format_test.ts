// deno-lint-ignore no-import-prefix -- as in anthropic_routes_test.ts
import Anthropic from "npm:@anthropic-ai/sdk@1.17.0";
import { assertEquals, assertMatch } from "@std/assert";
import type { GenerationEvent } from "../lib/core/generation.ts";
import { MessageEvents } from "../lib/http/anthropic_format.ts";
import { ServiceMetrics } from "../lib/http/service_metrics.ts";

/**
 * The streamed answer's events as Anthropic's SDK reads them: core events written by hand (the
 * model's text as a tool format has it) are rendered, and the SDK's own accumulator
 * (messages.stream, over a fetch that answers with the rendered events) assembles the message.
 */

const TIMINGS = {
  queuedMs: 1,
  prefillMs: 2,
  timeToFirstTokenMs: 3,
  decodeMs: 4,
  totalMs: 7,
  decodeTokensPerSecond: 100,
};

function events(pieces: string[], stopString?: string): GenerationEvent[] {
  return [
    { type: "started", promptTokens: 9 },
    ...pieces.map((text): GenerationEvent => ({ type: "token", text, ids: [1], logprob: 0 })),
    {
      type: "done",
      finishReason: "stop",
      usage: { promptTokens: 9, completionTokens: pieces.length, cachedTokens: 4 },
      timings: TIMINGS,
      ...(stopString === undefined ? {} : { stopString }),
    },
  ];
}

/** The SDK's final message for the events rendered by MessageEvents. */
async function sdkMessage(
  format: "hermes" | "generic" | undefined,
  evs: GenerationEvent[],
  stops: string[] = [],
) {
  const r = new MessageEvents(
    { id: "msg_1", type: "message", role: "assistant", model: "m" },
    format,
    stops,
    new ServiceMetrics(),
  );
  const body = evs.flatMap((ev) => r.render(ev).chunks).join("");
  const client = new Anthropic({
    apiKey: "unused",
    fetch: () =>
      Promise.resolve(new Response(body, { headers: { "content-type": "text/event-stream" } })),
  });
  return await client.messages.stream({ model: "m", max_tokens: 9, messages: [] }).finalMessage();
}

Deno.test("MessageEvents: a generic-format call streams as one tool_use block the SDK assembles", async () => {
  const m = await sdkMessage(
    "generic",
    events(['{"name": "get_weather", ', '"arguments": {"city": "Paris"}}']),
  );
  assertEquals(m.content.length, 1);
  const b = m.content[0]!;
  if (b.type !== "tool_use") throw new Error(JSON.stringify(m.content));
  assertMatch(b.id, /^toolu_[A-Za-z0-9]{24}$/);
  assertEquals([b.name, b.input], ["get_weather", { city: "Paris" }]);
  assertEquals([m.stop_reason, m.stop_sequence], ["tool_use", null]);
  assertEquals(m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0), 9);
  assertEquals(m.usage.output_tokens, 2);
});

Deno.test("MessageEvents: text, then a Hermes call: a text block, then a tool_use block", async () => {
  const m = await sdkMessage(
    "hermes",
    events(["Let me check.", "<tool_call>", '{"name": "now", "arguments": {}}', "</tool_call>"]),
  );
  assertEquals(m.content.map((b) => b.type), ["text", "tool_use"]);
  assertEquals(m.content[0]!.type === "text" && m.content[0]!.text, "Let me check.");
  assertEquals(m.content[1]!.type === "tool_use" && m.content[1]!.input, {});
  assertEquals(m.stop_reason, "tool_use");
});

Deno.test("MessageEvents: a client's stop string is stop_sequence; a template's is end_turn", async () => {
  const stopped = await sdkMessage(undefined, events(["Hello"], "\n\n"), ["\n\n"]);
  assertEquals([stopped.stop_reason, stopped.stop_sequence], ["stop_sequence", "\n\n"]);
  const template = await sdkMessage(undefined, events(["Hello"], "</s>"), ["\n\n"]);
  assertEquals([template.stop_reason, template.stop_sequence], ["end_turn", null]);
  assertEquals(template.content, [{ type: "text", text: "Hello" }]);
});
