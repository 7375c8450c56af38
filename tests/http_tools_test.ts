import { assert, assertEquals, assertMatch, assertNotEquals } from "@std/assert";
import { Ajv } from "ajv";
import { resultCacheKey } from "../lib/core/result_cache.ts";
import { parseSse, postJson, startService, TestSocket } from "./_http_harness.ts";

/**
 * Tool calls over HTTP on the fake model (lib/chat/tools.ts, tool_calls.ts): what reaches the
 * core (the prompt the template rendered with the tools, the constraint of a forced call), the
 * response shapes (message.tool_calls, delta.tool_calls, finish_reason "tool_calls"), and every
 * 400. The fake model samples uniformly under the grammar's mask, so a forced call's arguments
 * are random: they are checked with an independent validator (ajv) against the tool's schema.
 * The official client's two-turn flow on a real template and tokenizer is in
 * http_tools_openai_test.ts.
 */

/** A small template in the Hermes style: tools, calls and tool results all visible. */
const TEMPLATE =
  "{%- if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}" +
  "{%- for m in messages %}[{{ m.role }}]{{ m.content }}" +
  '{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{"name": "{{ c.function.name }}", ' +
  '"arguments": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}{% endif %}' +
  "{%- if m.role == 'tool' %}({{ m.tool_call_id }}){% endif %}{% endfor %}[assistant]";

const PARAMS = {
  type: "object",
  properties: {
    city: { enum: ["Paris", "Rome"] },
    days: { type: "integer", minimum: 1, maximum: 5 },
  },
  required: ["city", "days"],
  additionalProperties: false,
};
const WEATHER = {
  type: "function",
  function: { name: "get_weather", description: "Weather forecast", parameters: PARAMS },
};
const TIME = {
  type: "function",
  function: {
    name: "get_time",
    parameters: { type: "object", properties: {}, additionalProperties: false },
  },
};
const validate = new Ajv({ strict: false }).compile(PARAMS);
const msgs = [{ role: "user", content: "Weather in Paris?" }];
const fake = { chatTemplate: TEMPLATE, contextLength: 1024 };

/** A grammar that makes the fake model write one Hermes call (what a real model would). */
const HERMES_CALL =
  '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>';
const gbnf = (text: string) => `root ::= ${JSON.stringify(text)}`;

Deno.test("tool_choice naming a function: the output is constrained to a call that parses and validates", async () => {
  await using svc = await startService(fake);
  for (let seed = 1; seed <= 4; seed++) {
    const res = await postJson(svc.base + "/v1/chat/completions", {
      messages: msgs,
      tools: [WEATHER, TIME],
      tool_choice: { type: "function", function: { name: "get_weather" } },
      max_tokens: 100,
      seed,
    });
    assertEquals(res.status, 200);
    const body = await res.json();
    const choice = body.choices[0];
    assertEquals(choice.finish_reason, "tool_calls");
    assertEquals(choice.message.content, null);
    assertEquals(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0];
    assertMatch(call.id, /^call_[A-Za-z0-9]{24}$/);
    assertEquals([call.type, call.function.name], ["function", "get_weather"]);
    const args = JSON.parse(call.function.arguments);
    assert(validate(args), `${call.function.arguments}: ${JSON.stringify(validate.errors)}`);
  }
  const req = svc.backend.requests[0]!;
  // The template rendered the tools into the prompt; the core got the call's schema.
  const prompt = svc.backend.detokenize(req.prompt);
  assert(prompt.startsWith('<tools>{"type": "function"'), prompt);
  assert(
    prompt.includes('"name": "get_time"'),
    "every tool is rendered, only the named one is forced",
  );
  assertEquals(req.constraint?.type, "json_schema");
  const schema = JSON.parse((req.constraint as { schema: string }).schema);
  assertEquals(schema.properties.name, { const: "get_weather" });
  assertEquals(schema.properties.arguments, PARAMS);
});

Deno.test("a forced call cut by max_tokens comes back as that call so far, finish_reason length, content null, streamed or not", async () => {
  await using svc = await startService(fake);
  const request = {
    messages: msgs,
    tools: [WEATHER],
    tool_choice: { type: "function", function: { name: "get_weather" } },
    max_tokens: 40,
    seed: 3,
  };
  const whole = (await (await postJson(svc.base + "/v1/chat/completions", request)).json())
    .choices[0];
  assertEquals([whole.finish_reason, whole.message.content], ["length", null]);
  assertEquals(whole.message.tool_calls.length, 1);
  const fn = whole.message.tool_calls[0].function;
  assertEquals(fn.name, "get_weather");
  // The arguments as far as they came: an object begun, not finished.
  assert(fn.arguments.startsWith("{"), fn.arguments);
  let complete = true;
  try {
    JSON.parse(fn.arguments);
  } catch {
    complete = false;
  }
  assertEquals(complete, false, fn.arguments);
  // Streamed, the same seed gives the same call in deltas, and no content.
  const res = await postJson(svc.base + "/v1/chat/completions", { ...request, stream: true });
  type Delta = {
    content?: string;
    tool_calls?: { function: { name?: string; arguments: string } }[];
  };
  const chunks = parseSse(await res.text()).slice(0, -1) as {
    choices: { delta: Delta; finish_reason: string | null }[];
  }[];
  const deltas = chunks.flatMap((c) => c.choices[0]!.delta.tool_calls ?? []);
  assertEquals(chunks.map((c) => c.choices[0]!.delta.content ?? "").join(""), "");
  assertEquals(deltas.map((d) => d.function.name ?? "").join(""), fn.name);
  assertEquals(deltas.map((d) => d.function.arguments).join(""), fn.arguments);
  assertEquals(chunks.at(-1)!.choices[0]!.finish_reason, "length");
});

Deno.test("tool_choice required, streamed: delta.tool_calls carries id, type and name, then the arguments", async () => {
  await using svc = await startService(fake);
  const res = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    tools: [WEATHER, TIME],
    tool_choice: "required",
    max_tokens: 100,
    seed: 7,
    stream: true,
  });
  assertEquals(res.status, 200);
  type Chunk = {
    choices: {
      delta: {
        content?: string;
        tool_calls?: {
          index: number;
          id?: string;
          type?: string;
          function: { name?: string; arguments: string };
        }[];
      };
      finish_reason: string | null;
    }[];
  };
  const events = parseSse(await res.text());
  assertEquals(events.at(-1), "[DONE]");
  const chunks = events.slice(0, -1) as Chunk[];
  const deltas = chunks.flatMap((c) => c.choices[0]!.delta.tool_calls ?? []);
  assertEquals(
    chunks.map((c) => c.choices[0]!.delta.content ?? "").join(""),
    "",
    "no content beside the call",
  );
  assert(deltas.length >= 2, JSON.stringify(deltas));
  assertEquals(deltas.every((d) => d.index === 0), true);
  assertMatch(deltas[0]!.id!, /^call_/);
  assertEquals(deltas[0]!.type, "function");
  const name = deltas[0]!.function.name!;
  assert(["get_weather", "get_time"].includes(name), name);
  const args = JSON.parse(deltas.map((d) => d.function.arguments).join(""));
  if (name === "get_weather") assert(validate(args), JSON.stringify(args));
  else assertEquals(args, {});
  assertEquals(chunks.at(-1)!.choices[0]!.finish_reason, "tool_calls");
  const schema = JSON.parse((svc.backend.requests[0]!.constraint as { schema: string }).schema);
  assertEquals(schema.anyOf.length, 2, "required: a call to any of the tools");
});

Deno.test("tool_choice auto: a Hermes call in the text becomes message.tool_calls; words stay content", async () => {
  await using svc = await startService(fake);
  // The grammar stands in for a model that decided to call: it writes the text a Qwen model
  // would, token by token, and the server's parser reads it back.
  const forced = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    tools: [WEATHER],
    max_tokens: 100,
    temperature: 0,
    grammar: gbnf("I will check.\n" + HERMES_CALL),
  });
  assertEquals(forced.status, 200);
  const choice = (await forced.json()).choices[0];
  assertEquals(choice.finish_reason, "tool_calls");
  assertEquals(choice.message.content, "I will check.");
  assertEquals(choice.message.tool_calls[0].function, {
    name: "get_weather",
    arguments: '{"city":"Rome","days":2}',
  });
  // Streamed: the same content and call.
  const streamed = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    tools: [WEATHER],
    max_tokens: 100,
    temperature: 0,
    stream: true,
    grammar: gbnf("I will check.\n" + HERMES_CALL),
  });
  const chunks = parseSse(await streamed.text()).slice(0, -1) as {
    choices: {
      delta: {
        content?: string;
        tool_calls?: { function: { name?: string; arguments: string } }[];
      };
      finish_reason: string | null;
    }[];
  }[];
  assertEquals(chunks.map((c) => c.choices[0]!.delta.content ?? "").join(""), "I will check.");
  const calls = chunks.flatMap((c) => c.choices[0]!.delta.tool_calls ?? []);
  assertEquals(calls.map((d) => d.function.name ?? "").join(""), "get_weather");
  assertEquals(calls.map((d) => d.function.arguments).join(""), '{"city":"Rome","days":2}');
  assertEquals(chunks.at(-1)!.choices[0]!.finish_reason, "tool_calls");
  // Unconstrained, the fake model says words: content, finish "stop", no tool_calls.
  const free = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    tools: [WEATHER],
    max_tokens: 8,
    temperature: 0,
  });
  const fc = (await free.json()).choices[0];
  assertEquals(fc.finish_reason, "length");
  assertEquals(typeof fc.message.content, "string");
  assertEquals(fc.message.tool_calls, undefined);
  assertEquals(svc.backend.requests.at(-1)!.constraint, undefined, "auto never constrains");
});

Deno.test("n choices each get their own call; streamed logprobs cover every token, held back or not", async () => {
  await using svc = await startService(fake);
  const res = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    tools: [WEATHER],
    tool_choice: "required",
    max_tokens: 100,
    seed: 3,
    n: 2,
  });
  const body = await res.json();
  assertEquals(body.choices.length, 2);
  for (const c of body.choices) {
    assertEquals(c.finish_reason, "tool_calls");
    assert(validate(JSON.parse(c.message.tool_calls[0].function.arguments)), JSON.stringify(c));
  }
  const streamed = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    tools: [WEATHER],
    max_tokens: 100,
    temperature: 0,
    stream: true,
    logprobs: true,
    stream_options: { include_usage: true },
    grammar: gbnf("Ok " + HERMES_CALL),
  });
  const events = parseSse(await streamed.text()).slice(0, -1) as {
    choices: { logprobs: { content: unknown[] } | null }[];
    usage?: { completion_tokens: number } | null;
  }[];
  const lps = events.flatMap((e) => e.choices.flatMap((c) => c.logprobs?.content ?? []));
  assertEquals(lps.length, events.at(-1)!.usage!.completion_tokens);
});

Deno.test("tool_choice none: no tools in the prompt, and a call-shaped text stays content", async () => {
  await using svc = await startService(fake);
  const res = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    tools: [WEATHER],
    tool_choice: "none",
    max_tokens: 100,
    temperature: 0,
    grammar: gbnf(HERMES_CALL),
  });
  assertEquals(res.status, 200);
  const choice = (await res.json()).choices[0];
  assertEquals(choice.finish_reason, "stop");
  assertEquals(choice.message.content, HERMES_CALL);
  assertEquals(choice.message.tool_calls, undefined);
  assertEquals(
    svc.backend.requests[0]!.prompt,
    svc.backend.tokenize("[user]Weather in Paris?[assistant]", { bos: true, special: true }),
  );
});

Deno.test("an assistant message's tool_calls (content null) and the tool's result render through the template", async () => {
  await using svc = await startService(fake);
  const res = await postJson(svc.base + "/v1/chat/completions", {
    messages: [
      ...msgs,
      {
        role: "assistant",
        content: null,
        tool_calls: [{
          id: "call_1",
          type: "function",
          function: { name: "get_weather", arguments: '{"city": "Paris", "days": 1}' },
        }],
      },
      { role: "tool", tool_call_id: "call_1", content: '{"forecast": "sun"}' },
    ],
    tools: [WEATHER],
    max_tokens: 4,
    temperature: 0,
  });
  assertEquals(res.status, 200);
  const prompt = svc.backend.detokenize(svc.backend.requests[0]!.prompt);
  // Hand-written from TEMPLATE: the arguments go back as the object tojson writes.
  const tail =
    '[user]Weather in Paris?[assistant]<tool_call>{"name": "get_weather", "arguments": ' +
    '{"city": "Paris", "days": 1}}</tool_call>[tool]{"forecast": "sun"}(call_1)[assistant]';
  assert(prompt.endsWith(tail), prompt);
});

Deno.test("the result cache key and the request carry what tools change", async () => {
  await using svc = await startService(fake);
  const ask = (extra: Record<string, unknown>) =>
    postJson(svc.base + "/v1/chat/completions", {
      messages: msgs,
      max_tokens: 4,
      temperature: 0,
      ...extra,
    })
      .then((r) => r.body?.cancel());
  await ask({});
  await ask({ tools: [WEATHER] });
  await ask({ tools: [WEATHER], tool_choice: "required" });
  await ask({ tools: [WEATHER, TIME], tool_choice: "required" });
  const keys = svc.backend.requests.map((r) => resultCacheKey("m", r));
  assertEquals(
    new Set(keys).size,
    4,
    "tools (prompt) and a forced call (constraint) each change the key",
  );
  assertNotEquals(keys[1], null);
});

Deno.test("bad tools and tool_choice are 400s naming the field", async () => {
  await using svc = await startService(fake);
  const cases: [Record<string, unknown>, string, RegExp][] = [
    [{ tools: [{ type: "code_interpreter" }] }, "tools[0].type", /only tools of type "function"/],
    [
      { tools: [{ type: "function", function: {} }] },
      "tools[0].function.name",
      /Missing required field/,
    ],
    [
      { tools: [{ type: "function", function: { name: "a b" } }] },
      "tools[0].function.name",
      /function name/,
    ],
    [
      { tools: [{ type: "function", function: { name: "f", parameters: "x" } }] },
      "tools[0].function.parameters",
      /JSON Schema object/,
    ],
    [
      { tools: [{ type: "function", function: { name: "f", parameters: { type: "string" } } }] },
      "tools[0].function.parameters.type",
      /must be "object"/,
    ],
    [{ tools: [WEATHER, WEATHER] }, "tools[1].function.name", /two tools are named "get_weather"/],
    [{ tool_choice: "required" }, "tool_choice", /needs 'tools'/],
    [
      { tools: [WEATHER], tool_choice: { type: "function", function: { name: "nope" } } },
      "tool_choice.function.name",
      /no tool is named "nope" \(tools: "get_weather"\)/,
    ],
    [
      { tools: [WEATHER], tool_choice: "sometimes" },
      "tool_choice",
      /expected "none", "auto", "required"/,
    ],
    [
      { tools: [WEATHER], tool_choice: "required", response_format: { type: "json_object" } },
      "response_format",
      /already constrains the output to a call/,
    ],
    [
      {
        tools: [{
          type: "function",
          function: {
            name: "f",
            parameters: { type: "object", properties: { t: { type: "array", uniqueItems: true } } },
          },
        }],
        tool_choice: "required",
      },
      "tools[0].function.parameters.properties.t.uniqueItems",
      /keyword 'uniqueItems' is not supported/,
    ],
    [
      { messages: [{ role: "tool", content: "x" }] },
      "messages[0].tool_call_id",
      /answers the call/,
    ],
    [
      { messages: [...msgs, { role: "tool", tool_call_id: "call_nowhere", content: "x" }] },
      "messages[1].tool_call_id",
      /no earlier assistant message has a tool call of id "call_nowhere" \(none has tool_calls\)/,
    ],
    [
      {
        messages: [...msgs, {
          role: "assistant",
          content: null,
          tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: "{}" } }],
        }, { role: "tool", tool_call_id: "c2", content: "x" }],
      },
      "messages[2].tool_call_id",
      /no earlier assistant message has a tool call of id "c2"$/,
    ],
    [
      { messages: [{ role: "user", content: null }] },
      "messages[0].content",
      /only an assistant message with tool_calls/,
    ],
    [
      {
        messages: [...msgs, {
          role: "assistant",
          content: null,
          tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: "{oops" } }],
        }],
      },
      "messages[1].tool_calls[0].function.arguments",
      /not JSON/,
    ],
    [{ functions: [{ name: "f" }] }, "functions", /not supported/],
    [
      { chat_template_kwargs: { tools: [WEATHER] } },
      "chat_template_kwargs.tools",
      /set by the server/,
    ],
  ];
  for (const [extra, param, message] of cases) {
    const res = await postJson(svc.base + "/v1/chat/completions", {
      messages: msgs,
      max_tokens: 4,
      ...extra,
    });
    const body = await res.json();
    assertEquals([res.status, body.error?.param], [400, param], JSON.stringify(extra));
    assertMatch(body.error.message, message, JSON.stringify(extra));
  }
  assertEquals(svc.backend.requests.length, 0, "nothing reached the core");
});

Deno.test("a model whose template has no tool support, or no template, takes tools in the generic format: described in its prompt", async () => {
  const zephyr =
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}</s>\n{% endfor %}<|assistant|>\n";
  for (const opts of [{ chatTemplate: zephyr, contextLength: 1024 }, { contextLength: 1024 }]) {
    await using svc = await startService(opts);
    const promptLength = async (body: Record<string, unknown>) => {
      const res = await postJson(svc.base + "/v1/chat/completions", {
        messages: msgs,
        max_tokens: 2,
        ...body,
      });
      assertEquals(res.status, 200, JSON.stringify(await res.clone().json()));
      await res.body?.cancel();
      return svc.backend.requests.at(-1)!.prompt.length;
    };
    // The tool's name and schema are in the prompt: it grows by at least their text's tokens.
    const bare = await promptLength({});
    const withTools = await promptLength({ tools: [WEATHER] });
    assert(withTools - bare >= JSON.stringify(PARAMS).length / 4, `${bare} -> ${withTools}`);
    // A tool result is a text turn there.
    const tool = await postJson(svc.base + "/v1/chat/completions", {
      messages: [
        ...msgs,
        {
          role: "assistant",
          content: null,
          tool_calls: [{
            id: "c",
            type: "function",
            function: { name: "get_weather", arguments: "{}" },
          }],
        },
        { role: "tool", tool_call_id: "c", content: "x" },
      ],
      tools: [WEATHER],
      max_tokens: 2,
    });
    assertEquals(tool.status, 200);
    await tool.body?.cancel();
  }
});

Deno.test("the WebSocket protocol refuses tools with an error frame pointing at the HTTP API", async () => {
  await using svc = await startService(fake);
  const ws = await TestSocket.open(svc.wsUrl);
  try {
    ws.send({ type: "generate", id: "t", messages: msgs, tools: [WEATHER] });
    const [err] = await ws.collect("t");
    assertEquals([err!.type, err!.param], ["error", "tools"]);
    assertMatch(String(err!.message), /use POST \/v1\/chat\/completions/);
  } finally {
    await ws.close();
  }
});

Deno.test("POST /tokenize with messages renders tool calls and results as chat completions do", async () => {
  await using svc = await startService(fake);
  const messages = [
    ...msgs,
    {
      role: "assistant",
      content: null,
      tool_calls: [{
        id: "c1",
        type: "function",
        function: { name: "get_weather", arguments: '{"city": "Rome", "days": 2}' },
      }],
    },
    { role: "tool", tool_call_id: "c1", content: "rain" },
  ];
  const res = await postJson(svc.base + "/tokenize", { messages });
  assertEquals(res.status, 200);
  const { tokens } = await res.json();
  const chat = await postJson(svc.base + "/v1/chat/completions", {
    messages,
    max_tokens: 1,
    temperature: 0,
  });
  assertEquals(tokens.length, (await chat.json()).usage.prompt_tokens);
});
