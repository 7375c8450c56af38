// deno-lint-ignore no-import-prefix -- as in http_openai_client_test.ts
import OpenAI from "npm:openai@7.59.0";
import { assert, assertEquals, assertMatch } from "@std/assert";
import { Ajv } from "ajv";
import { parseSse, postJson, startService, TestSocket } from "./_http_harness.ts";

/**
 * Structured output over HTTP and the WebSocket (lib/http/response_format.ts): the fields reach
 * the core as a constraint, the fake engine samples under the mask, and the text parses and
 * validates with an independent validator (ajv).
 */

const msgs = [{ role: "user" as const, content: "Describe a cat" }];
const SCHEMA = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 5 },
    age: { type: "integer", minimum: 1, maximum: 20 },
    color: { enum: ["black", "white"] },
  },
  required: ["name", "age", "color"],
  additionalProperties: false,
};
const validate = new Ajv({ strict: false }).compile(SCHEMA);

Deno.test("POST /v1/chat/completions with response_format json_schema answers JSON that validates", async () => {
  await using svc = await startService();
  const res = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    max_tokens: 200,
    temperature: 0,
    response_format: {
      type: "json_schema",
      json_schema: { name: "cat", schema: SCHEMA, strict: true },
    },
  });
  assertEquals(res.status, 200);
  const body = await res.json();
  assertEquals(body.choices[0].finish_reason, "stop");
  const content = body.choices[0].message.content;
  assert(validate(JSON.parse(content)), `${content}: ${JSON.stringify(validate.errors)}`);
  assertEquals(svc.backend.requests[0]!.constraint, {
    type: "json_schema",
    schema: JSON.stringify(SCHEMA),
  });
});

Deno.test("POST /v1/chat/completions with response_format json_object constrains the output to a JSON object", async () => {
  await using svc = await startService();
  const res = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    max_tokens: 30,
    seed: 5,
    response_format: { type: "json_object" },
  });
  assertEquals(res.status, 200);
  const content: string = (await res.json()).choices[0].message.content;
  assertEquals(svc.backend.requests[0]!.constraint, { type: "json_object" });
  // The fake model draws uniformly among allowed ids, so its strings run long (a finished
  // object is checked on a real model in structured_output_test.ts); unconstrained it says
  // only words (" the", " was"), never a brace or a quote.
  assert(content.startsWith('{"'), content);
  const free = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    max_tokens: 30,
    seed: 5,
  });
  assert(!(await free.json()).choices[0].message.content.includes("{"));
});

Deno.test("a streamed chat completion under a schema: the deltas join into JSON that validates", async () => {
  await using svc = await startService();
  const res = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    max_tokens: 200,
    seed: 11,
    stream: true,
    response_format: { type: "json_schema", json_schema: { name: "cat", schema: SCHEMA } },
  });
  assertEquals(res.status, 200);
  const events = parseSse(await res.text()).filter((e) => e !== "[DONE]") as Array<
    { choices: Array<{ delta: { content?: string }; finish_reason: string | null }> }
  >;
  const text = events.map((e) => e.choices[0]?.delta.content ?? "").join("");
  assertEquals(events.at(-1)!.choices[0]!.finish_reason, "stop");
  assert(validate(JSON.parse(text)), text);
});

Deno.test("POST /v1/completions takes response_format, llama-server's json_schema and grammar, and vLLM's guided_json", async () => {
  await using svc = await startService();
  for (
    const extra of [
      { response_format: { type: "json_schema", json_schema: { name: "c", schema: SCHEMA } } },
      { json_schema: SCHEMA },
      { guided_json: JSON.stringify(SCHEMA) },
    ]
  ) {
    const res = await postJson(svc.base + "/v1/completions", {
      prompt: "A cat:",
      max_tokens: 200,
      seed: 3,
      ...extra,
    });
    assertEquals(res.status, 200, JSON.stringify(extra));
    const text = (await res.json()).choices[0].text;
    assert(validate(JSON.parse(text)), `${JSON.stringify(extra)}: ${text}`);
  }
  const res = await postJson(svc.base + "/v1/completions", {
    prompt: "Answer:",
    max_tokens: 20,
    seed: 9,
    grammar: 'root ::= ("yes" | "no") " because " [a-z]{1,5}',
  });
  assertEquals(res.status, 200);
  assertMatch((await res.json()).choices[0].text, /^(yes|no) because [a-z]{1,5}$/);
});

Deno.test("vLLM's guided_choice: every answer is exactly one of the choices (quotes and backslashes included), and a bad list is a 400", async () => {
  await using svc = await startService();
  const choices = ["red", "green", 'say "blue"', "a\\b"];
  const seen = new Set<string>();
  for (let seed = 0; seed < 12; seed++) {
    const res = await postJson(svc.base + "/v1/completions", {
      prompt: "Pick a colour:",
      max_tokens: 20,
      temperature: 1,
      seed,
      guided_choice: choices,
    });
    assertEquals(res.status, 200);
    const text = (await res.json()).choices[0].text;
    assert(choices.includes(text), `not a choice: ${JSON.stringify(text)}`);
    seen.add(text);
  }
  assert(seen.size > 1, `12 seeds all gave ${[...seen]}`);
  for (const bad of [[], [""], "red"]) {
    const res = await postJson(svc.base + "/v1/completions", { prompt: "x", guided_choice: bad });
    assertEquals(res.status, 400, JSON.stringify(bad));
    assertMatch((await res.json()).error.message, /guided_choice/);
  }
});

Deno.test("a schema keyword constrained decoding cannot enforce is a 400 naming it and its place", async () => {
  await using svc = await startService();
  const schema = { type: "object", properties: { tags: { type: "array", uniqueItems: true } } };
  const res = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    response_format: { type: "json_schema", json_schema: { name: "x", schema } },
  });
  assertEquals(res.status, 400);
  const err = (await res.json()).error;
  assertEquals(err.param, "response_format.json_schema.schema.properties.tags.uniqueItems");
  assertMatch(err.message, /keyword 'uniqueItems' is not supported/);
  const both = await postJson(svc.base + "/v1/completions", {
    prompt: "x",
    json_schema: SCHEMA,
    grammar: 'root ::= "a"',
  });
  assertEquals(both.status, 400);
  assertEquals((await both.json()).error.param, "grammar");
  assertEquals(svc.backend.requests.length, 0);
});

Deno.test("a grammar XGrammar cannot parse is a 400 invalid_request, not a 500", async () => {
  await using svc = await startService();
  const res = await postJson(svc.base + "/v1/completions", { prompt: "x", grammar: "root ::= (" });
  assertEquals(res.status, 400);
  const err = (await res.json()).error;
  assertEquals(err.code, "invalid_request");
  assertMatch(err.message, /^Cannot compile the grammar: /);
});

Deno.test("the WebSocket generate frame takes response_format and json_schema", async () => {
  await using svc = await startService();
  const ws = await TestSocket.open(svc.wsUrl);
  try {
    ws.send({
      type: "generate",
      id: "a",
      prompt: "A cat:",
      max_tokens: 200,
      seed: 4,
      response_format: { type: "json_schema", json_schema: { name: "cat", schema: SCHEMA } },
    });
    ws.send({
      type: "generate",
      id: "b",
      prompt: "A cat:",
      max_tokens: 200,
      seed: 5,
      json_schema: SCHEMA,
    });
    for (const id of ["a", "b"]) {
      const frames = await ws.collect(id);
      const text = frames.filter((f) => f.type === "token").map((f) => f.text).join("");
      assertEquals(frames.at(-1)!.finish_reason, "stop", text);
      assert(validate(JSON.parse(text)), text);
    }
    ws.send({
      type: "generate",
      id: "bad",
      prompt: "x",
      json_schema: { type: "object", not: { required: ["a"] } },
    });
    const [err] = await ws.collect("bad");
    assertEquals(err!.type, "error");
    assertEquals(err!.param, "json_schema.not");
  } finally {
    await ws.close();
  }
});

Deno.test("the official openai client's response_format json_schema round-trips, streaming and not", async () => {
  await using svc = await startService();
  const client = new OpenAI({ baseURL: svc.base + "/v1", apiKey: "unused", maxRetries: 0 });
  const response_format = {
    type: "json_schema" as const,
    json_schema: { name: "cat", schema: SCHEMA, strict: true },
  };
  const out = await client.chat.completions.create({
    model: "fake-llama",
    messages: msgs,
    max_tokens: 200,
    seed: 21,
    response_format,
  });
  const content = out.choices[0]!.message.content!;
  assert(validate(JSON.parse(content)), content);
  const stream = await client.chat.completions.create({
    model: "fake-llama",
    messages: msgs,
    max_tokens: 200,
    seed: 21,
    response_format,
    stream: true,
  });
  let text = "";
  for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
  assertEquals(text, content);
});
