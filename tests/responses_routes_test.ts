// deno-lint-ignore no-import-prefix -- not in the import map (deno.json is the lead's); pinned here
import OpenAI from "npm:openai@7.59.0";
import { assert, assertEquals, assertInstanceOf, assertMatch, assertRejects } from "@std/assert";
import { Ajv } from "ajv";
import { compatPath } from "./harness/compat.ts";
import { spawnUntilListening } from "./_serve_child.ts";

/**
 * OpenAI's Responses API through the official openai client (`responses.create`, streamed and
 * not, and `responses.stream`, whose accumulator checks every event against the output so far),
 * against the real server (`main.ts serve`, cpu engine) on a compat file with a real vocabulary
 * and chat template (TinyLlama's, without tool syntax: tools take the generic format). The
 * oracle for the text and token counts is the same request through /v1/chat/completions
 * (greedy, so the two agree token for token); for calls and JSON output, ajv on the schema.
 */

const MAIN = new URL("../main.ts", import.meta.url).pathname;
const STEM = "tinyllama-like-q4_0";
const KEY = "sk-responses-test";
const SYSTEM = "You are terse.";
const QUESTION = "Name a colour.";
const WEATHER = {
  type: "object",
  properties: {
    city: { type: "string", minLength: 1, maxLength: 12 },
    unit: { enum: ["celsius", "fahrenheit"] },
  },
  required: ["city", "unit"],
  additionalProperties: false,
};
const WEATHER_TOOL = {
  type: "function" as const,
  name: "get_weather",
  description: "Current weather in a city",
  parameters: WEATHER,
  strict: true,
};
const validWeather = new Ajv({ strict: false }).compile(WEATHER);

async function chat(base: string, body: Record<string, unknown>) {
  const res = await fetch(base + "/v1/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: STEM, temperature: 0, ...body }),
  });
  assertEquals(res.status, 200, await res.clone().text());
  return await res.json();
}

Deno.test("OpenAI's Responses API through the openai client: create, stream, tools, text.format, errors", async (t) => {
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
  const client = new OpenAI({ baseURL: base + "/v1", apiKey: KEY, maxRetries: 0 });
  try {
    await t.step(
      "responses.create: the text and token counts of /v1/chat/completions",
      async () => {
        const reference = await chat(base, {
          messages: [{ role: "system", content: SYSTEM }, { role: "user", content: QUESTION }],
          max_tokens: 12,
        });
        const out = await client.responses.create({
          model: STEM,
          instructions: SYSTEM,
          input: QUESTION,
          max_output_tokens: 12,
          temperature: 0,
        });
        assertMatch(out.id, /^resp_/);
        assertEquals([out.object, out.model], ["response", STEM]);
        assertEquals((out as unknown as { store: boolean }).store, false, "nothing is stored");
        assertEquals(out.output_text, reference.choices[0].message.content);
        assertEquals(out.status, "incomplete");
        assertEquals(out.incomplete_details, { reason: "max_output_tokens" });
        assertEquals(out.usage?.output_tokens, 12);
        assertEquals(out.usage?.input_tokens, reference.usage.prompt_tokens);
        assertEquals(out.output.length, 1);
        assertEquals([out.output[0]!.type, (out.output[0] as { role: string }).role], [
          "message",
          "assistant",
        ]);
        // The same conversation as items (input_text parts, a developer message) is the same.
        const items = await client.responses.create({
          model: STEM,
          input: [
            { role: "developer", content: SYSTEM },
            { type: "message", role: "user", content: [{ type: "input_text", text: QUESTION }] },
          ],
          max_output_tokens: 12,
          temperature: 0,
        });
        const asSystem = await chat(base, {
          messages: [{ role: "developer", content: SYSTEM }, { role: "user", content: QUESTION }],
          max_tokens: 12,
        });
        assertEquals(items.output_text, asSystem.choices[0].message.content);
      },
    );

    await t.step("stream: true: the response.* events in order, the deltas the text", async () => {
      const whole = await client.responses.create({
        model: STEM,
        input: QUESTION,
        max_output_tokens: 10,
        temperature: 0,
      });
      const stream = await client.responses.create({
        model: STEM,
        input: QUESTION,
        max_output_tokens: 10,
        temperature: 0,
        stream: true,
      });
      const types: string[] = [];
      const seqs: number[] = [];
      let deltas = "";
      let final: OpenAI.Responses.Response | undefined;
      for await (const ev of stream) {
        types.push(ev.type);
        seqs.push(ev.sequence_number);
        if (ev.type === "response.output_text.delta") deltas += ev.delta;
        if (ev.type === "response.incomplete") final = ev.response;
      }
      assertEquals(deltas, whole.output_text);
      assertEquals(seqs, types.map((_, i) => i), "sequence_number counts the events from 0");
      assertEquals(types.slice(0, 4), [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
      ]);
      assertEquals(types.slice(-4), [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
      ]);
      assertEquals(types.length, 4 + 10 + 4, "a delta per token");
      assert(types.slice(4, -4).every((x) => x === "response.output_text.delta"), types.join());
      assertEquals(final?.usage?.output_tokens, 10);
      assertEquals(final?.usage?.input_tokens, whole.usage?.input_tokens);
      const msg = final?.output[0];
      assertEquals(msg?.type === "message" ? msg.content : undefined, [
        { type: "output_text", text: whole.output_text, annotations: [], logprobs: [] },
      ]);

      // The client's own accumulator (strict about indexes, ids and order) agrees.
      const acc = await client.responses.stream({
        model: STEM,
        input: QUESTION,
        max_output_tokens: 10,
        temperature: 0,
      }).finalResponse();
      assertEquals(acc.output_text, whole.output_text);
    });

    await t.step(
      "a function tool round trip: required call, function_call_output, answer",
      async () => {
        const first = await client.responses.create({
          model: STEM,
          input: "Weather in Paris?",
          tools: [WEATHER_TOOL],
          tool_choice: "required",
          max_output_tokens: 96,
          temperature: 0,
        });
        assertEquals(first.status, "completed");
        const call = first.output.find((o) => o.type === "function_call");
        if (call?.type !== "function_call") throw new Error(JSON.stringify(first.output));
        assertMatch(call.call_id, /^call_/);
        assertMatch(call.id ?? "", /^fc_/);
        assertEquals(call.name, "get_weather");
        const args = JSON.parse(call.arguments);
        assert(validWeather(args), `${call.arguments}: ${JSON.stringify(validWeather.errors)}`);

        const history: OpenAI.Responses.ResponseInput = [
          { role: "user", content: "Weather in Paris?" },
          ...first.output as OpenAI.Responses.ResponseInputItem[],
          { type: "function_call_output", call_id: call.call_id, output: '{"sky": "clear"}' },
        ];
        const second = await client.responses.create({
          model: STEM,
          input: history,
          tools: [WEATHER_TOOL],
          max_output_tokens: 8,
          temperature: 0,
        });
        // The same history in chat's spelling renders to the same prompt and greedy answer.
        const reference = await chat(base, {
          messages: [
            { role: "user", content: "Weather in Paris?" },
            {
              role: "assistant",
              content: null,
              tool_calls: [{
                id: call.call_id,
                type: "function",
                function: { name: call.name, arguments: call.arguments },
              }],
            },
            { role: "tool", tool_call_id: call.call_id, content: '{"sky": "clear"}' },
          ],
          tools: [{
            type: "function",
            function: {
              name: WEATHER_TOOL.name,
              description: WEATHER_TOOL.description,
              parameters: WEATHER,
              strict: true,
            },
          }],
          max_tokens: 8,
        });
        assertEquals(second.usage?.input_tokens, reference.usage.prompt_tokens);
        const refMessage = reference.choices[0].message;
        if (refMessage.tool_calls) {
          const again = second.output.find((o) => o.type === "function_call");
          assertEquals(
            again?.type === "function_call" ? again.arguments : undefined,
            refMessage.tool_calls[0].function.arguments,
          );
        } else assertEquals(second.output_text, refMessage.content);

        // Streamed with a named function: the client assembles the call from the events.
        const streamed = await client.responses.stream({
          model: STEM,
          input: "Weather in Paris?",
          tools: [WEATHER_TOOL],
          tool_choice: { type: "function", name: "get_weather" },
          max_output_tokens: 96,
          temperature: 0,
        }).finalResponse();
        const s = streamed.output.find((o) => o.type === "function_call");
        if (s?.type !== "function_call") throw new Error(JSON.stringify(streamed.output));
        assertEquals(JSON.parse(s.arguments), args, "greedy: the same call as the forced one");
      },
    );

    await t.step("text.format json_schema: the text is JSON the schema accepts", async () => {
      const schema = {
        type: "object",
        properties: {
          colour: { type: "string", minLength: 1, maxLength: 10 },
          bright: { type: "boolean" },
        },
        required: ["colour", "bright"],
        additionalProperties: false,
      };
      const out = await client.responses.create({
        model: STEM,
        input: QUESTION,
        text: { format: { type: "json_schema", name: "colour", schema, strict: true } },
        max_output_tokens: 96,
        temperature: 0,
      });
      assertEquals(out.status, "completed", out.output_text);
      const validate = new Ajv({ strict: false }).compile(schema);
      assert(
        validate(JSON.parse(out.output_text)),
        `${out.output_text}: ${JSON.stringify(validate.errors)}`,
      );
      assertEquals(out.text?.format?.type, "json_schema");
    });

    await t.step(
      "bad inputs: 400 in OpenAI's error shape, naming the Responses field",
      async () => {
        const bad = async (body: Record<string, unknown>, param: string, pattern: RegExp) => {
          const err = await assertRejects(() =>
            client.responses.create({
              model: STEM,
              input: QUESTION,
              max_output_tokens: 8,
              ...body,
            } as OpenAI.Responses.ResponseCreateParamsNonStreaming)
          );
          assertInstanceOf(err, OpenAI.BadRequestError);
          assertEquals(err.status, 400);
          const e = err.error as { message: string; type: string; param: string; code: string };
          assertEquals([e.type, e.code, e.param], [
            "invalid_request_error",
            "invalid_request",
            param,
          ]);
          assertMatch(e.message, pattern);
        };
        await bad(
          { previous_response_id: "resp_123" },
          "previous_response_id",
          /Invalid 'previous_response_id': previous_response_id is not supported.*got "resp_123"/,
        );
        await bad({ store: true }, "store", /Invalid 'store': store: true is not supported/);
        await bad({ background: true }, "background", /'background'/);
        await bad(
          {
            input: [{
              role: "user",
              content: [{
                type: "input_image",
                image_url: "data:image/png;base64,AA",
                detail: "auto",
              }],
            }],
          },
          "input[0].content",
          /'input\[0\]\.content': part 0: content parts of type "input_image" are not supported/,
        );
        await bad({ temperature: 5 }, "temperature", /Invalid 'temperature'.*got 5/);
        await bad({ max_output_tokens: 0 }, "max_output_tokens", /Invalid 'max_output_tokens'/);
        await bad(
          { tools: [WEATHER_TOOL], tool_choice: { type: "function", name: "nope" } },
          "tool_choice.name",
          /'tool_choice\.name': no tool is named "nope"/,
        );
        await bad(
          { tools: [{ type: "web_search_preview" }] },
          "tools[0].type",
          /only tools of type "function"/,
        );
        await bad(
          { tools: [{ ...WEATHER_TOOL, parameters: { type: "array" } }] },
          "tools[0].parameters.type",
          /'tools\[0\]\.parameters\.type'/,
        );
        await bad(
          { input: [{ type: "function_call_output", call_id: "call_x", output: "1" }] },
          "input[0]",
          /'input\[0\]': no earlier assistant message has a tool call/,
        );
        const metrics = await (await fetch(base + "/metrics", {
          headers: { authorization: `Bearer ${KEY}` },
        })).text();
        assertMatch(
          metrics,
          /llm_generations_total\{api="responses",finish_reason="length"\} [1-9]/,
          "the generations are counted under api=responses",
        );
      },
    );
  } finally {
    server.child.kill("SIGTERM");
    await server.log();
  }
});

Deno.test("On a server of several models: /v1/responses goes to the model its body names", async () => {
  const OTHER = "stories260K-q4_1";
  const server = await spawnUntilListening([
    "run",
    "--allow-all",
    MAIN,
    "serve",
    "--model",
    compatPath(STEM),
    "--model",
    compatPath(OTHER),
    "--port",
    "0",
    "--backend",
    "cpu",
    "--context-length",
    "512",
    "--kv-memory",
    "8MiB",
  ]);
  const client = new OpenAI({ baseURL: server.base + "/v1", apiKey: "none", maxRetries: 0 });
  try {
    for (const model of [OTHER, STEM]) {
      const out = await client.responses.create({
        model,
        input: "Once upon a time",
        max_output_tokens: 6,
        temperature: 0,
      });
      const reference = await client.chat.completions.create({
        model,
        messages: [{ role: "user", content: "Once upon a time" }],
        max_tokens: 6,
        temperature: 0,
      });
      assertEquals(out.model, model);
      assertEquals(out.output_text, reference.choices[0]!.message.content);
      assertEquals(out.usage?.input_tokens, reference.usage?.prompt_tokens);
    }
    const err = await assertRejects(() =>
      client.responses.create({ model: "gpt-4o", input: "Hi", max_output_tokens: 4 })
    );
    assertInstanceOf(err, OpenAI.NotFoundError);
    assertEquals((err.error as { code: string }).code, "model_not_found");
  } finally {
    server.child.kill("SIGTERM");
    await server.log();
  }
});
