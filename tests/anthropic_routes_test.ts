// deno-lint-ignore no-import-prefix -- not in the import map (deno.json is the lead's); pinned here
import Anthropic from "npm:@anthropic-ai/sdk@1.17.0";
import {
  assert,
  assertEquals,
  assertGreater,
  assertInstanceOf,
  assertMatch,
  assertRejects,
} from "@std/assert";
import { Ajv } from "ajv";
import { compatPath } from "./harness/compat.ts";
import { spawnUntilListening } from "./_serve_child.ts";

/**
 * Anthropic's Messages API through the official @anthropic-ai/sdk, against the real server
 * (`main.ts serve`, cpu engine) on a compat file with a real vocabulary and chat template
 * (TinyLlama's, without tool syntax: tools take the generic format). The oracle for the text
 * and the prompt's token count is the same request through /v1/chat/completions (greedy, so
 * the two agree token for token); for tool inputs, ajv on the tool's schema; for
 * stop_sequences, the greedy text without them.
 */

const MAIN = new URL("../main.ts", import.meta.url).pathname;
const STEM = "tinyllama-like-q4_0";
const KEY = "sk-anthropic-test";
const SYSTEM = "You are terse.";
const USER = { role: "user" as const, content: "Name a colour." };
const WEATHER = {
  name: "get_weather",
  description: "Current weather in a city",
  input_schema: {
    type: "object" as const,
    properties: {
      city: { type: "string", minLength: 1, maxLength: 12 },
      unit: { enum: ["celsius", "fahrenheit"] },
    },
    required: ["city", "unit"],
    additionalProperties: false,
  },
};
const validWeather = new Ajv({ strict: false }).compile(WEATHER.input_schema);

async function chat(base: string, body: Record<string, unknown>) {
  const res = await fetch(base + "/v1/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: STEM, temperature: 0, ...body }),
  });
  assertEquals(res.status, 200, await res.clone().text());
  return await res.json();
}

/**
 * The SDK's request types (1.17) no longer list temperature, top_p and top_k, which the API
 * still takes and which greedy comparisons need: the bodies are cast.
 */
function create(p: Record<string, unknown>): Anthropic.MessageCreateParamsNonStreaming {
  return p as unknown as Anthropic.MessageCreateParamsNonStreaming;
}
function streamed(p: Record<string, unknown>): Anthropic.MessageStreamParams {
  return p as unknown as Anthropic.MessageStreamParams;
}

function textOf(m: Anthropic.Message): string {
  return m.content.map((b) => b.type === "text" ? b.text : "").join("");
}

/** Prompt tokens as Anthropic's usage splits them: computed plus read from the cache. */
function promptTokens(u: Anthropic.Usage): number {
  return u.input_tokens + (u.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0);
}

Deno.test("Anthropic's Messages API through @anthropic-ai/sdk: create, stream, tools, count_tokens, errors", async (t) => {
  const server = await spawnUntilListening([
    "run",
    "--allow-all",
    MAIN,
    "serve",
    "--model",
    compatPath(STEM),
    "--port",
    "0",
    "--backend",
    "cpu",
    "--context-length",
    "1024",
    "--kv-memory",
    "8MiB",
    "--api-key",
    KEY,
  ]);
  const base = server.base;
  // The SDK sends its key as x-api-key.
  const client = new Anthropic({ baseURL: base, apiKey: KEY, maxRetries: 0 });
  try {
    await t.step("messages.create: the text and token counts of /v1/chat/completions", async () => {
      const reference = await chat(base, {
        messages: [{ role: "system", content: SYSTEM }, USER],
        max_tokens: 12,
      });
      const out = await client.messages.create(create({
        model: STEM,
        system: SYSTEM,
        messages: [USER],
        max_tokens: 12,
        temperature: 0,
      }));
      assertMatch(out.id, /^msg_/);
      assertEquals([out.type, out.role, out.model], ["message", "assistant", STEM]);
      assertEquals(textOf(out), reference.choices[0].message.content);
      assertEquals([out.stop_reason, out.stop_sequence], ["max_tokens", null]);
      assertEquals(out.usage.output_tokens, 12);
      assertEquals(promptTokens(out.usage), reference.usage.prompt_tokens);
    });

    await t.step("messages.stream: Anthropic's event sequence, the same text", async () => {
      const whole = await client.messages.create(create({
        model: STEM,
        messages: [USER],
        max_tokens: 10,
        temperature: 0,
      }));
      const stream = client.messages.stream(streamed({
        model: STEM,
        messages: [USER],
        max_tokens: 10,
        temperature: 0,
      }));
      const types: string[] = [];
      stream.on("streamEvent", (ev) => types.push(ev.type));
      let deltas = "";
      stream.on("text", (d) => deltas += d);
      const final = await stream.finalMessage();
      assertEquals(textOf(final), textOf(whole));
      assertEquals(deltas, textOf(whole));
      assertEquals(final.stop_reason, "max_tokens");
      assertEquals(final.usage.output_tokens, 10);
      assertEquals(promptTokens(final.usage), promptTokens(whole.usage));
      assertEquals(types[0], "message_start");
      assertEquals(types[1], "content_block_start");
      assertEquals(types.slice(-3), ["content_block_stop", "message_delta", "message_stop"]);
      assert(types.slice(2, -3).every((x) => x === "content_block_delta"), types.join(","));
      assertEquals(types.length, 2 + 10 + 3, "a delta per token");
    });

    await t.step(
      "stop_sequences: the text ends before the first, which stop_sequence names",
      async () => {
        const free = await client.messages.create(create({
          model: STEM,
          messages: [USER],
          max_tokens: 16,
          temperature: 0,
        }));
        const text = textOf(free);
        const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 2);
        assert(stop.length === 2, text);
        const cut = await client.messages.create(create({
          model: STEM,
          messages: [USER],
          max_tokens: 16,
          temperature: 0,
          stop_sequences: ["never-in-it-\u0001", stop],
        }));
        assertEquals([cut.stop_reason, cut.stop_sequence], ["stop_sequence", stop]);
        assertEquals(textOf(cut), text.slice(0, text.indexOf(stop)));
      },
    );

    await t.step(
      "a tool-use round trip: forced call, tool_result, answer; streamed too",
      async () => {
        const first = await client.messages.create(create({
          model: STEM,
          messages: [{ role: "user", content: "Weather in Paris?" }],
          tools: [WEATHER],
          tool_choice: { type: "any" },
          max_tokens: 96,
          temperature: 0,
        }));
        assertEquals(first.stop_reason, "tool_use");
        const use = first.content.find((b) => b.type === "tool_use");
        if (use?.type !== "tool_use") throw new Error(JSON.stringify(first.content));
        assertMatch(use.id, /^toolu_/);
        assertEquals(use.name, "get_weather");
        assert(
          validWeather(use.input),
          `${JSON.stringify(use.input)}: ${JSON.stringify(validWeather.errors)}`,
        );

        const history: Anthropic.MessageParam[] = [
          { role: "user", content: "Weather in Paris?" },
          { role: "assistant", content: first.content },
          {
            role: "user",
            content: [
              { type: "tool_result", tool_use_id: use.id, content: '{"sky": "clear"}' },
              { type: "text", text: "Thanks." },
            ],
          },
        ];
        const second = await client.messages.create(create({
          model: STEM,
          messages: history,
          tools: [WEATHER],
          max_tokens: 8,
          temperature: 0,
        }));
        assertEquals(second.role, "assistant");
        assert(
          ["end_turn", "max_tokens", "tool_use"].includes(second.stop_reason!),
          second.stop_reason!,
        );
        const counted = await client.messages.countTokens({
          model: STEM,
          messages: history,
          tools: [WEATHER],
        });
        assertEquals(promptTokens(second.usage), counted.input_tokens);
        // The same history in OpenAI's spelling renders to the same prompt.
        const reference = await chat(base, {
          messages: [
            { role: "user", content: "Weather in Paris?" },
            {
              role: "assistant",
              content: null,
              tool_calls: [{
                id: use.id,
                type: "function",
                function: { name: use.name, arguments: JSON.stringify(use.input) },
              }],
            },
            { role: "tool", tool_call_id: use.id, content: '{"sky": "clear"}' },
            { role: "user", content: "Thanks." },
          ],
          tools: [{
            type: "function",
            function: {
              name: WEATHER.name,
              description: WEATHER.description,
              parameters: WEATHER.input_schema,
            },
          }],
          max_tokens: 8,
        });
        assertEquals(counted.input_tokens, reference.usage.prompt_tokens);

        // Streamed with a named tool: the SDK assembles the input from input_json_delta.
        const streamedCall = await client.messages.stream(streamed({
          model: STEM,
          messages: [{ role: "user", content: "Weather in Paris?" }],
          tools: [WEATHER],
          tool_choice: { type: "tool", name: "get_weather" },
          max_tokens: 96,
          temperature: 0,
        })).finalMessage();
        assertEquals(streamedCall.stop_reason, "tool_use");
        const s = streamedCall.content.find((b) => b.type === "tool_use");
        if (s?.type !== "tool_use") throw new Error(JSON.stringify(streamedCall.content));
        assertEquals(s.input, use.input, "greedy: the same call as the forced one");
      },
    );

    await t.step("output_config.format: the text is JSON the schema accepts", async () => {
      const schema = {
        type: "object",
        properties: {
          colour: { type: "string", minLength: 1, maxLength: 10 },
          bright: { type: "boolean" },
        },
        required: ["colour", "bright"],
        additionalProperties: false,
      };
      const out = await client.messages.create(create({
        model: STEM,
        messages: [USER],
        output_config: { format: { type: "json_schema", schema } },
        max_tokens: 96,
        temperature: 0,
      }));
      assertEquals(out.stop_reason, "end_turn", textOf(out));
      const validate = new Ajv({ strict: false }).compile(schema);
      assert(
        validate(JSON.parse(textOf(out))),
        `${textOf(out)}: ${JSON.stringify(validate.errors)}`,
      );
    });

    await t.step(
      "countTokens: the prompt tokens of the same chat through /v1/chat/completions",
      async () => {
        const counted = await client.messages.countTokens({
          model: STEM,
          system: SYSTEM,
          messages: [USER],
        });
        const reference = await chat(base, {
          messages: [{ role: "system", content: SYSTEM }, USER],
          max_tokens: 1,
        });
        assertEquals(counted.input_tokens, reference.usage.prompt_tokens);
      },
    );

    await t.step(
      "bad inputs: 4xx in Anthropic's error shape, naming the Anthropic field",
      async () => {
        const bad = async (body: Record<string, unknown>, pattern: RegExp) => {
          const err = await assertRejects(() =>
            client.messages.create(create({
              model: STEM,
              messages: [USER],
              max_tokens: 8,
              ...body,
            }) as Anthropic.MessageCreateParamsNonStreaming)
          );
          assertInstanceOf(err, Anthropic.BadRequestError);
          assertEquals(err.status, 400);
          const e = err.error as { type: string; error: { type: string; message: string } };
          assertEquals(e.type, "error");
          assertEquals(e.error.type, "invalid_request_error");
          assertMatch(e.error.message, pattern);
        };
        await bad({ max_tokens: undefined }, /Missing required field 'max_tokens'/);
        await bad({ max_tokens: 0 }, /Invalid 'max_tokens'/);
        await bad({ temperature: 3 }, /Invalid 'temperature'.*got 3/);
        await bad(
          { stop_sequences: "x".repeat(3).split("").concat(Array(16).fill("y")) },
          /'stop_sequences'/,
        );
        await bad({
          messages: [{
            role: "user",
            content: [{
              type: "image",
              source: { type: "base64", media_type: "image/png", data: "AA" },
            }],
          }],
        }, /'messages\[0\]\.content': block 0: content blocks of type "image" are not supported/);
        await bad({ messages: [USER, { role: "assistant", content: "Red" }] }, /prefill/);
        await bad({ thinking: { type: "enabled", budget_tokens: 1024 } }, /'thinking'/);
        await bad(
          { tools: [WEATHER], tool_choice: { type: "tool", name: "nope" } },
          /'tool_choice\.name': no tool is named "nope"/,
        );
        await bad({ tools: [{ type: "web_search_20250305", name: "web_search" }] }, /server tools/);
        await bad({
          messages: [{
            role: "user",
            content: [{ type: "tool_result", tool_use_id: "toolu_x", content: "1" }],
          }],
        }, /'messages\[0\]': no earlier assistant message has a tool call/);
        await bad(
          { tools: [{ ...WEATHER, input_schema: { type: "array" } }] },
          /'tools\[0\]\.input_schema\.type'/,
        );
        const unknown = await fetch(base + "/v1/messages", {
          method: "POST",
          headers: { "content-type": "application/json", "x-api-key": KEY },
          body: JSON.stringify({ model: "claude-sonnet-4", max_tokens: 8, messages: [USER] }),
        });
        assertEquals(unknown.status, 404);
        assertEquals(await unknown.json(), {
          type: "error",
          error: {
            type: "not_found_error",
            message: `The model "claude-sonnet-4" does not exist; this server serves "${STEM}"`,
          },
        });
        const wrongKey = new Anthropic({ baseURL: base, apiKey: "sk-wrong-key", maxRetries: 0 });
        const err = await assertRejects(() =>
          wrongKey.messages.create({ model: STEM, messages: [USER], max_tokens: 4 })
        );
        assertInstanceOf(err, Anthropic.AuthenticationError);
        const metrics = await (await fetch(base + "/metrics", {
          headers: { "x-api-key": KEY },
        })).text();
        const m = /llm_generations_total\{api="messages",finish_reason="length"\} (\d+)/.exec(
          metrics,
        );
        assertGreater(Number(m?.[1] ?? 0), 2, "the generations are counted under api=messages");
        assertEquals((err.error as { error: { type: string } }).error.type, "authentication_error");
      },
    );
  } finally {
    server.child.kill("SIGTERM");
    await server.log();
  }
});
