import { assert, assertEquals, assertLess, assertMatch, assertThrows } from "@std/assert";
import { Ajv } from "ajv";
import { GRAMMAR_LIMITS } from "../lib/grammar/grammar_limits.ts";
import { checkConstraintBounds } from "../lib/grammar/constraint_bounds.ts";
import { ConstraintError } from "../lib/grammar/constraint_error.ts";
import { postJson, startService, TestSocket } from "./_http_harness.ts";

/**
 * The bounds a constraint passes before XGrammar sees it (lib/grammar/constraint_bounds.ts),
 * over HTTP with the real grammar engine: the schemas of issue 37 that trapped XGrammar or
 * stalled it for minutes are 400s naming the bound, and the server goes on constraining
 * output for every key.
 */

const A = "sk-tenant-a";
const B = "sk-tenant-b";
const auth = (key: string) => ({ authorization: `Bearer ${key}` });
const msgs = [{ role: "user", content: "Describe a cat" }];

/** A template that shows the model its tools (the fake core's default has none). */
const TOOL_TEMPLATE =
  "{%- if tools %}<tools>{% for t in tools %}{{ t.function.name }}{% endfor %}</tools>{% endif %}" +
  "{%- for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}[assistant]";

function nestedObjects(depth: number): unknown {
  let s: unknown = { type: "string" };
  for (let i = 0; i < depth; i++) s = { type: "object", properties: { a: s }, required: ["a"] };
  return s;
}

function nestedArrays(depth: number): unknown {
  let s: unknown = { type: "string" };
  for (let i = 0; i < depth; i++) s = { type: "array", items: s };
  return s;
}

function schemaFormat(schema: unknown) {
  return { type: "json_schema", json_schema: { name: "x", schema } };
}

/** A small schema no earlier request sent: it must be compiled afresh. */
const FRESH = {
  type: "object",
  properties: {
    colour: { enum: ["red", "green"] },
    legs: { type: "integer", minimum: 0, maximum: 8 },
  },
  required: ["colour", "legs"],
  additionalProperties: false,
};
const validFresh = new Ajv({ strict: false }).compile(FRESH);

async function error400(res: Response): Promise<string> {
  const body = await res.json();
  assertEquals(res.status, 400, JSON.stringify(body));
  assertEquals(body.error.code, "invalid_request");
  return body.error.message;
}

Deno.test("the nested schemas that trapped XGrammar (60 objects, 1,000 arrays, 2,000 GBNF parentheses, 70-deep tool parameters) are 400s naming the depth bound; a fresh schema from another key compiles afterwards", async () => {
  await using svc = await startService({ chatTemplate: TOOL_TEMPLATE, contextLength: 1024 }, {
    apiKeys: [A, B],
  });
  const chat = svc.base + "/v1/chat/completions";
  const limit = String(GRAMMAR_LIMITS.maxDepth);
  for (const schema of [nestedObjects(60), nestedArrays(1000)]) {
    const res = await postJson(
      chat,
      { messages: msgs, response_format: schemaFormat(schema) },
      auth(A),
    );
    const message = await error400(res);
    assertMatch(message, /nests \d+ levels deep/);
    assert(message.includes(`limit is ${limit}`), message);
  }
  const gbnf = `root ::= ${"(".repeat(2000)}"a"${")".repeat(2000)}`;
  const g = await postJson(svc.base + "/v1/completions", { prompt: "x", grammar: gbnf }, auth(A));
  assertMatch(await error400(g), /nests parentheses 2000 deep; the limit is 64/);
  const tool = await postJson(chat, {
    messages: msgs,
    tools: [{
      type: "function",
      function: {
        name: "deep",
        parameters: { type: "object", properties: { p: nestedObjects(70) } },
      },
    }],
    tool_choice: "required",
  }, auth(A));
  assertMatch(await error400(tool), /nests \d+ levels deep/);

  const fresh = await postJson(chat, {
    messages: msgs,
    max_tokens: 200,
    temperature: 0,
    response_format: schemaFormat(FRESH),
  }, auth(B));
  assertEquals(fresh.status, 200);
  const content = (await fresh.json()).choices[0].message.content;
  assert(validFresh(JSON.parse(content)), content);
  const obj = await postJson(chat, {
    messages: msgs,
    max_tokens: 20,
    response_format: { type: "json_object" },
  }, auth(B));
  assertEquals(obj.status, 200);
  assert((await obj.json()).choices[0].message.content.startsWith("{"));
});

Deno.test("the catastrophic pattern is a 400 naming the repetition bound at once, and a canary constrained request sent meanwhile is answered within 2 s", async () => {
  await using svc = await startService();
  const chat = svc.base + "/v1/chat/completions";
  const t0 = performance.now();
  const [attack, canary] = await Promise.all([
    postJson(chat, {
      messages: msgs,
      response_format: schemaFormat({ type: "string", pattern: "^(a{0,1000}){0,1000}$" }),
    }),
    postJson(chat, {
      messages: msgs,
      max_tokens: 200,
      temperature: 0,
      response_format: schemaFormat(FRESH),
    }).then(async (r) => ({ status: r.status, body: await r.json(), ms: performance.now() - t0 })),
  ]);
  assertMatch(
    await error400(attack),
    /repetition expands to 1000000 states .*; the limit is 10000/,
  );
  assertEquals(canary.status, 200);
  assert(validFresh(JSON.parse(canary.body.choices[0].message.content)));
  assertLess(canary.ms, 2000);
});

Deno.test("maxLength and minLength of 10^9, a minimum no max_tokens can write, and an enum over the limit are 400s naming bound, limit and value", async () => {
  await using svc = await startService();
  const url = svc.base + "/v1/completions";
  const ask = (schema: unknown, maxTokens = 50) =>
    postJson(url, { prompt: "x", max_tokens: maxTokens, json_schema: schema });
  assertMatch(
    await error400(await ask({ type: "string", maxLength: 1e9 })),
    /'maxLength' is 1000000000; the limit for maxLength is 100000/,
  );
  assertMatch(
    await error400(await ask({ type: "string", minLength: 1e9 })),
    /'minLength' is 1000000000; the limit for minLength is 100000/,
  );
  const short = await error400(
    await ask({ type: "array", items: { type: "integer" }, minItems: 5000 }, 10),
  );
  assertMatch(short, /'minItems' \(5000\) cannot be written in 10 tokens \(max_tokens/);
  const many = { enum: Array.from({ length: 1001 }, (_, i) => `v${i}`) };
  assertMatch(await error400(await ask(many)), /enums hold 1001 values in all; the limit is 1000/);
});

Deno.test("a $ref cycle with no base case is a 400 (it answered 200 with empty text); a recursion with a way out compiles", async () => {
  await using svc = await startService();
  const url = svc.base + "/v1/completions";
  const loop = {
    $ref: "#/$defs/node",
    $defs: {
      node: {
        type: "object",
        properties: { next: { $ref: "#/$defs/node" } },
        required: ["next"],
      },
    },
  };
  const message = await error400(await postJson(url, { prompt: "x", json_schema: loop }));
  assertMatch(message, /'\$ref' cycle with no base case: #\/\$defs\/node/);
  const tree = structuredClone(loop);
  tree.$defs.node.required = [];
  const ok = await postJson(url, { prompt: "x", max_tokens: 30, json_schema: tree });
  assertEquals(ok.status, 200);
});

Deno.test("min_tokens with an output constraint is a 400 naming min_tokens: a complete constrained output must end at once", async () => {
  await using svc = await startService();
  const res = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    min_tokens: 5,
    response_format: { type: "json_object" },
  });
  const body = await res.json();
  assertEquals(res.status, 400);
  assertEquals(body.error.param, "min_tokens");
  assertMatch(body.error.message, /cannot be combined with an output constraint/);
  const alone = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    max_tokens: 8,
    min_tokens: 5,
  });
  assertEquals(alone.status, 200);
  assertEquals(svc.backend.requests.length, 1);
});

Deno.test("a grammar engine that cannot start answers constrained requests 503 with Retry-After, plain ones 200; once it can, the next request starts it", async () => {
  const grammar: { bundle?: string } = { bundle: "/nonexistent/web-xgrammar/lib/index.js" };
  await using svc = await startService({ grammar });
  const chat = svc.base + "/v1/chat/completions";
  const constrained = { messages: msgs, max_tokens: 20, response_format: { type: "json_object" } };
  for (let i = 0; i < 2; i++) {
    const res = await postJson(chat, constrained);
    const body = await res.json();
    assertEquals(res.status, 503);
    assert(res.headers.has("retry-after"));
    assertMatch(body.error.message, /the grammar engine could not be started .*retry later/);
  }
  assertEquals((await postJson(chat, { messages: msgs, max_tokens: 4 })).status, 200);
  delete grammar.bundle;
  const res = await postJson(chat, constrained);
  assertEquals(res.status, 200);
  assert((await res.json()).choices[0].message.content.startsWith("{"));
});

Deno.test("a schema or grammar over the byte bound is refused naming its size (HTTP bodies stop at the same 1 MiB first)", () => {
  const schema = JSON.stringify({ type: "object", description: "x".repeat(1_100_000) });
  assertThrows(
    () => checkConstraintBounds({ type: "json_schema", schema }, GRAMMAR_LIMITS),
    ConstraintError,
    `the schema is ${schema.length} bytes; the limit is 1048576`,
  );
  // 50,000 alternatives, which XGrammar compiles in time, stay under it.
  const words = Array.from({ length: 50_000 }, (_, i) => `"w${i}"`).join(" | ");
  assertEquals(
    checkConstraintBounds({ type: "grammar", grammar: `root ::= ${words}` }, GRAMMAR_LIMITS)
      .minimum,
    0,
  );
});

Deno.test("on the WebSocket, the 60-nested schema is an error frame naming the bound, and the next frame's schema is served", async () => {
  await using svc = await startService();
  const ws = await TestSocket.open(svc.wsUrl);
  try {
    ws.send({ type: "generate", id: "deep", prompt: "x", json_schema: nestedObjects(60) });
    const [err] = await ws.collect("deep");
    assertEquals(err!.type, "error");
    assertEquals(err!.code, "invalid_request");
    assertMatch(String(err!.message), /nests 121 levels deep .*the limit is 64/);
    ws.send({
      type: "generate",
      id: "ok",
      prompt: "x",
      max_tokens: 200,
      seed: 3,
      json_schema: FRESH,
    });
    const frames = await ws.collect("ok");
    const text = frames.filter((f) => f.type === "token").map((f) => f.text).join("");
    assertEquals(frames.at(-1)!.finish_reason, "stop", text);
    assert(validFresh(JSON.parse(text)), text);
  } finally {
    await ws.close();
  }
});
