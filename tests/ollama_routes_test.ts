// deno-lint-ignore no-import-prefix -- not in the import map (deno.json is the lead's); pinned here
import { Ollama } from "npm:ollama@0.6.4";
import { assert, assertEquals, assertGreater, assertMatch, assertRejects } from "@std/assert";
import { Ajv } from "ajv";
import type { GenerationEvent } from "../lib/core/generation.ts";
import { readGgufHeader } from "../lib/model/gguf.ts";
import { Reply } from "../lib/http/ollama_routes.ts";
import { ServiceMetrics } from "../lib/http/service_metrics.ts";
import { compatPath } from "./harness/compat.ts";
import { spawnUntilListening } from "./_serve_child.ts";

/**
 * Ollama's API through the official `ollama` npm client, against the real server (`main.ts
 * serve`, cpu engine) on a compat file with a real vocabulary and chat template (TinyLlama's,
 * which has no tool syntax). The oracle for the text is the same request through
 * /v1/chat/completions and /v1/completions (greedy, so the two must agree token for token);
 * for the listings, the model file itself (its size, its header's template); for the timings,
 * the client's own clock; for `format`, ajv.
 */

const MAIN = new URL("../main.ts", import.meta.url).pathname;
const STEM = "tinyllama-like-q4_0";
const KEY = "sk-ollama-test";
const MESSAGES = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Name a colour." },
];

async function openAi(base: string, path: string, body: unknown) {
  const res = await fetch(base + path, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: JSON.stringify(body),
  });
  assertEquals(res.status, 200, await res.clone().text());
  return await res.json();
}

/** A raw request to an /api route: status and parsed body. */
async function raw(base: string, path: string, body?: unknown, key: string | null = KEY) {
  const res = await fetch(base + path, {
    method: body === undefined ? "GET" : "POST",
    headers: {
      ...(body === undefined ? {} : { "content-type": "application/json" }),
      ...(key === null ? {} : { authorization: `Bearer ${key}` }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  return { status: res.status, body: await res.json() };
}

/** Ollama's error shape: exactly one field, a string naming the problem. */
function assertOllamaError(body: unknown, pattern: RegExp) {
  const b = body as Record<string, unknown>;
  assertEquals(Object.keys(b), ["error"], JSON.stringify(b));
  assertEquals(typeof b.error, "string");
  assertMatch(b.error as string, pattern);
}

Deno.test("Ollama's API through the ollama client: chat, generate, listings, format, errors", async (t) => {
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
    "512",
    "--kv-memory",
    "8MiB",
    "--api-key",
    KEY,
  ]);
  const base = server.base;
  const ollama = new Ollama({ host: base, headers: { Authorization: `Bearer ${KEY}` } });
  try {
    await t.step(
      "chat, not streamed: the text of /v1/chat/completions, real counts and timings",
      async () => {
        const reference = await openAi(base, "/v1/chat/completions", {
          model: STEM,
          messages: MESSAGES,
          temperature: 0,
          max_tokens: 12,
        });
        const started = performance.now();
        const out = await ollama.chat({
          model: STEM,
          messages: MESSAGES,
          options: { temperature: 0, num_predict: 12 },
        });
        const wallNs = (performance.now() - started) * 1e6;
        assertEquals(out.message.role, "assistant");
        assertEquals(out.message.content, reference.choices[0].message.content);
        assertEquals(out.done, true);
        assertEquals(out.done_reason, "length");
        assertEquals(out.model, STEM);
        assertEquals(out.eval_count, 12);
        assertEquals(out.prompt_eval_count, reference.usage.prompt_tokens);
        for (const f of ["total_duration", "prompt_eval_duration", "eval_duration"] as const) {
          assert(Number.isInteger(out[f]) && out[f] > 0, `${f}: ${out[f]}`);
        }
        assert(Number.isInteger(out.load_duration) && out.load_duration >= 0);
        // The durations are parts of the request, which the client's clock bounds.
        assert(out.total_duration <= wallNs, `${out.total_duration} ns > ${wallNs} ns measured`);
        assert(out.prompt_eval_duration + out.eval_duration <= out.total_duration);
      },
    );

    await t.step(
      "chat, streamed as NDJSON: the same text, the counts on the last line",
      async () => {
        const whole = await ollama.chat({
          model: `${STEM}:latest`,
          messages: MESSAGES,
          options: { temperature: 0, num_predict: 10 },
        });
        const stream = await ollama.chat({
          model: `${STEM}:latest`,
          messages: MESSAGES,
          stream: true,
          options: { temperature: 0, num_predict: 10 },
        });
        let text = "";
        const parts = [];
        for await (const part of stream) {
          parts.push(part);
          text += part.message.content;
        }
        assertEquals(text, whole.message.content);
        assertEquals(parts.filter((p) => p.done).length, 1);
        const last = parts.at(-1)!;
        assertEquals([last.done, last.done_reason, last.eval_count], [true, "length", 10]);
        assertEquals(parts.length, 11, "a line per token, then the last");
        assertEquals(last.prompt_eval_count, whole.prompt_eval_count);
      },
    );

    await t.step(
      "generate: a user turn through the template; raw: the prompt as given",
      async () => {
        const chat = await openAi(base, "/v1/chat/completions", {
          model: STEM,
          messages: [{ role: "user", content: "Once upon a time" }],
          temperature: 0,
          max_tokens: 8,
        });
        const out = await ollama.generate({
          model: STEM,
          prompt: "Once upon a time",
          options: { temperature: 0, num_predict: 8 },
        });
        assertEquals(out.response, chat.choices[0].message.content);
        assertEquals(out.prompt_eval_count, chat.usage.prompt_tokens);

        const completion = await openAi(base, "/v1/completions", {
          model: STEM,
          prompt: "Once upon a time",
          temperature: 0,
          max_tokens: 8,
        });
        let streamed = "";
        for await (
          const part of await ollama.generate({
            model: STEM,
            prompt: "Once upon a time",
            raw: true,
            stream: true,
            options: { temperature: 0, num_predict: 8 },
          })
        ) {
          streamed += part.response;
          if (part.done) assertEquals(part.prompt_eval_count, completion.usage.prompt_tokens);
        }
        assertEquals(streamed, completion.choices[0].text);
      },
    );

    await t.step("list, show and ps describe the served file", async () => {
      const size = (await Deno.stat(compatPath(STEM))).size;
      const header = await readGgufHeader(compatPath(STEM));
      const list = await ollama.list();
      assertEquals(list.models.map((m) => m.name), [STEM]);
      const m = list.models[0]!;
      assertEquals(m.size, size);
      assertEquals(m.details.format, "gguf");
      assertEquals(m.details.family, header.metadata.get("general.architecture")?.value);
      assertEquals(m.details.quantization_level, "Q4_0");
      const params = header.tensorInfos.reduce((n, i) => n + i.dims.reduce((a, b) => a * b, 1), 0);
      assertEquals(m.details.parameter_size, `${(params / 1e6).toFixed(2)}M`);

      const show = await ollama.show({ model: STEM });
      assertEquals(show.template, header.metadata.get("tokenizer.chat_template")?.value);
      assertEquals(show.details.family, m.details.family);
      assert(show.capabilities.includes("tools"), JSON.stringify(show.capabilities));
      assertEquals(
        (show.model_info as unknown as Record<string, unknown>)["llama.context_length"],
        512,
        "the context the server runs with",
      );

      const ps = await ollama.ps();
      assertEquals(ps.models.map((p) => [p.name, p.size]), [[STEM, size]]);
      assertMatch((await ollama.version()).version, /^\d+\.\d+\.\d+$/);
    });

    await t.step(
      "format as a JSON schema: the answer is an object the schema accepts",
      async () => {
        const schema = {
          type: "object",
          properties: {
            colour: { type: "string", minLength: 1, maxLength: 10 },
            bright: { type: "boolean" },
          },
          required: ["colour", "bright"],
          additionalProperties: false,
        };
        const out = await ollama.chat({
          model: STEM,
          messages: MESSAGES,
          format: schema,
          options: { temperature: 0, num_predict: 96 },
        });
        assertEquals(out.done_reason, "stop", out.message.content);
        const validate = new Ajv({ strict: false }).compile(schema);
        const value = JSON.parse(out.message.content);
        assert(validate(value), `${out.message.content}: ${JSON.stringify(validate.errors)}`);
        const json = await ollama.chat({
          model: STEM,
          messages: MESSAGES,
          format: "json",
          options: { temperature: 0, num_predict: 96 },
        });
        if (json.done_reason === "stop") JSON.parse(json.message.content);
        else assertEquals(json.eval_count, 96);
      },
    );

    await t.step(
      "a tool history: calls and results render as /v1/chat/completions renders them",
      async () => {
        const tools = [{
          type: "function",
          function: {
            name: "get_weather",
            description: "Current weather in a city",
            parameters: {
              type: "object",
              properties: { city: { type: "string" } },
              required: ["city"],
            },
          },
        }];
        const out = await ollama.chat({
          model: STEM,
          messages: [
            { role: "user", content: "Weather in Paris?" },
            {
              role: "assistant",
              content: "",
              tool_calls: [{ function: { name: "get_weather", arguments: { city: "Paris" } } }],
            },
            { role: "tool", content: '{"sky": "clear"}', tool_name: "get_weather" },
          ],
          tools,
          options: { temperature: 0, num_predict: 4 },
        });
        const reference = await openAi(base, "/v1/chat/completions", {
          model: STEM,
          messages: [
            { role: "user", content: "Weather in Paris?" },
            {
              role: "assistant",
              content: "",
              tool_calls: [{
                id: "call_1",
                type: "function",
                function: { name: "get_weather", arguments: '{"city":"Paris"}' },
              }],
            },
            { role: "tool", tool_call_id: "call_1", content: '{"sky": "clear"}' },
          ],
          tools,
          temperature: 0,
          max_tokens: 4,
        });
        assertEquals(out.prompt_eval_count, reference.usage.prompt_tokens);
        const refCalls = reference.choices[0].message.tool_calls ?? [];
        assertEquals(out.message.tool_calls?.length ?? 0, refCalls.length);
        if (refCalls.length === 0) {
          assertEquals(out.message.content, reference.choices[0].message.content);
        }
      },
    );

    await t.step("bad inputs: 4xx in Ollama's shape, with the Ollama field named", async () => {
      // The client's ResponseError (not exported): the body's `error` and the status.
      const err = await assertRejects(
        () => ollama.chat({ model: "llama3.2", messages: MESSAGES }),
      ) as Error & { error: string; status_code: number };
      assertEquals(err.name, "ResponseError");
      assertEquals(err.status_code, 404);
      assertMatch(
        err.error,
        /"llama3\.2" does not exist; this server serves "tinyllama-like-q4_0"/,
      );

      const cases: [Record<string, unknown>, number, RegExp][] = [
        [{ options: { temperature: 5 } }, 400, /^Invalid 'options\.temperature': .*<=2; got 5/],
        [{ options: { num_predict: 0 } }, 400, /^Invalid 'options\.num_predict'/],
        [{ options: { num_ctx: 4096 } }, 400, /'options\.num_ctx': the model's context is 512/],
        [{ options: { num_ctx: 8 } }, 400, /options\.num_ctx, 8 tokens/],
        [{ options: { num_gpu: 1 } }, 400, /'options\.num_gpu': it is a setting of the server/],
        [{ options: { typical_p: 0.5 } }, 400, /'options\.typical_p'.*typical sampling/],
        [{ options: { tempreature: 0 } }, 400, /Unknown field 'tempreature' in 'options'/],
        [{ format: "xml" }, 400, /'format': expected "json" or a JSON schema object/],
        [{ think: true }, 400, /'think': thinking/],
        [{ messages: [{ role: "user", content: "x", images: ["AAAA"] }] }, 400, /images are not/],
        [{ messages: [{ role: "tool", content: "1" }] }, 400, /'messages\[0\]': a tool message/],
        [{ tools: [{ type: "function", function: { name: "bad name" } }] }, 400, /'tools\[0\]/],
      ];
      for (const [fields, status, pattern] of cases) {
        const res = await raw(base, "/api/chat", { model: STEM, messages: MESSAGES, ...fields });
        assertEquals(res.status, status, JSON.stringify(fields));
        assertOllamaError(res.body, pattern);
      }
      const gen: [Record<string, unknown>, RegExp][] = [
        [{ template: "{{ .Prompt }}" }, /'template': a template per request/],
        [{ suffix: "end" }, /'suffix'/],
        [{ context: [1, 2] }, /'context'/],
        [{ raw: true, system: "x" }, /'system': a raw prompt/],
      ];
      for (const [fields, pattern] of gen) {
        const res = await raw(base, "/api/generate", { model: STEM, prompt: "Hi", ...fields });
        assertEquals(res.status, 400, JSON.stringify(fields));
        assertOllamaError(res.body, pattern);
      }
      const pull = await raw(base, "/api/pull", { model: "llama3.2" });
      assertEquals(pull.status, 404);
      assertOllamaError(pull.body, /does not download.*serve --model FILE.*docs\/models\.md/);
      assertEquals((await raw(base, "/api/pull", { model: STEM })).body, { status: "success" });
      const embed = await raw(base, "/api/embed", { model: STEM, input: [] });
      assertEquals(embed.status, 400);
      assertOllamaError(
        embed.body,
        /^Invalid 'input': too small: expected array to have >=1 items; got \[\]/,
      );
      const copy = await raw(base, "/api/copy", { source: STEM, destination: "x" });
      assertEquals(copy.status, 501);
      assertOllamaError(copy.body, /not supported: this server does not download or build/);

      const noKey = await raw(base, "/api/tags", undefined, null);
      assertEquals(noKey.status, 401);
      assertOllamaError(noKey.body, /Missing API key/);
      const notJson = await fetch(base + "/api/chat", {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
        body: "{",
      });
      assertEquals(notJson.status, 400);
      assertOllamaError(await notJson.json(), /not valid JSON/);
      // The app's body limit (1 MiB by default) and strict UTF-8 decoding hold here too.
      const post = (body: BodyInit) =>
        fetch(base + "/api/chat", {
          method: "POST",
          headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
          body,
        });
      const big = await post(JSON.stringify({ model: STEM, prompt: "x".repeat(1 << 21) }));
      assertEquals(big.status, 413);
      assertOllamaError(await big.json(), /the limit is 1048576 bytes/);
      const latin1 = await post(new Uint8Array([0x7b, 0x22, 0xe9, 0x22, 0x3a, 0x31, 0x7d]));
      assertEquals(latin1.status, 400);
      assertOllamaError(await latin1.json(), /not valid UTF-8/);
    });

    await t.step("embed and embeddings: the vectors of /v1/embeddings", async () => {
      const input = ["Once upon a time", "The end."];
      const out = await ollama.embed({ model: STEM, input });
      const res = await fetch(base + "/v1/embeddings", {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
        body: JSON.stringify({ model: STEM, input }),
      });
      const reference = await res.json();
      assertEquals(out.embeddings.length, 2);
      for (const [i, v] of out.embeddings.entries()) {
        const r = reference.data[i].embedding as number[];
        assertEquals(v.length, r.length);
        assert(v.every((x, k) => Math.abs(x - r[k]!) < 1e-6), `input ${i} differs`);
      }
      assertEquals(out.prompt_eval_count, reference.usage.prompt_tokens);
      assert(out.total_duration > 0);
      const one = await ollama.embeddings({ model: STEM, prompt: input[0]! });
      assertEquals(one.embedding, out.embeddings[0]);
    });

    await t.step("an empty chat loads the model, as Ollama's clients preload it", async () => {
      const out = await ollama.chat({ model: STEM, messages: [] });
      assertEquals([out.done, out.done_reason, out.message.content], [true, "load", ""]);
      assertGreater(Date.parse(String(out.created_at)), 0);
      // The generations were counted under their own API label.
      const metrics = await (await fetch(base + "/metrics", {
        headers: { authorization: `Bearer ${KEY}` },
      })).text();
      const m = /llm_generations_total\{api="ollama",finish_reason="length"\} (\d+)/.exec(metrics);
      assertGreater(Number(m?.[1] ?? 0), 5, metrics.slice(0, 400));
    });
  } finally {
    server.child.kill("SIGTERM");
    await server.log();
  }
});

Deno.test("Reply: a generic-format call streams as tool_calls the ollama client reads as objects", async () => {
  const parsed = {
    input: { prompt: "", promptParam: "messages" },
    stream: true,
    includeUsage: false,
    n: 1,
    model: "m",
    toolFormat: "generic" as const,
  };
  const reply = new Reply("m", "chat", parsed, performance.now(), new ServiceMetrics());
  const pieces = ['{"name": "get_weather", ', '"arguments": {"city": "Paris"}}'];
  const events: GenerationEvent[] = [
    { type: "started", promptTokens: 7 },
    ...pieces.map((text): GenerationEvent => ({ type: "token", text, ids: [1], logprob: 0 })),
    {
      type: "done",
      finishReason: "stop",
      usage: { promptTokens: 7, completionTokens: 2, cachedTokens: 0 },
      timings: {
        queuedMs: 1,
        prefillMs: 2,
        timeToFirstTokenMs: 3,
        decodeMs: 4,
        totalMs: 7,
        decodeTokensPerSecond: 250,
      },
    },
  ];
  const body = events.flatMap((ev) => reply.lines(ev).chunks).join("");
  const client = new Ollama({
    host: "http://unused.invalid",
    fetch: () => Promise.resolve(new Response(body)),
  });
  const parts = [];
  for await (const p of await client.chat({ model: "m", messages: [], stream: true })) {
    parts.push(p);
  }
  const calls = parts.flatMap((p) => p.message.tool_calls ?? []);
  assertEquals(
    calls,
    [{
      function: { index: 0, name: "get_weather", arguments: { city: "Paris" } },
    }] as unknown as typeof calls,
  );
  assertEquals(parts.map((p) => p.message.content).join(""), "", "the call is not text");
  const last = parts.at(-1)!;
  assertEquals([last.done, last.done_reason, last.eval_count], [true, "stop", 2]);
  assertEquals([last.prompt_eval_duration, last.eval_duration, last.load_duration], [
    2e6,
    4e6,
    1e6,
  ]);
});

Deno.test("On a server of several models: listings from the catalog, chat and messages to each", async () => {
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
  const ollama = new Ollama({ host: server.base });
  try {
    // The front answers the listings itself: both models, none loaded.
    const tags = await ollama.list();
    assertEquals(tags.models.map((m) => [m.name, m.size]), [
      [STEM, (await Deno.stat(compatPath(STEM))).size],
      [OTHER, (await Deno.stat(compatPath(OTHER))).size],
    ]);
    assertEquals((await ollama.ps()).models, []);
    // A streamed chat to a model not loaded waits for the load: every line is JSON.
    let text = "";
    for await (
      const p of await ollama.chat({
        model: `${OTHER}:latest`,
        messages: [{ role: "user", content: "Once upon a time" }],
        stream: true,
        options: { temperature: 0, num_predict: 6 },
      })
    ) text += p.message.content;
    const reference = await (await fetch(server.base + "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: OTHER,
        messages: [{ role: "user", content: "Once upon a time" }],
        temperature: 0,
        max_tokens: 6,
      }),
    })).json();
    assertEquals(text, reference.choices[0].message.content);
    assertEquals((await ollama.ps()).models.map((m) => m.name), [OTHER]);
    assertEquals((await ollama.show({ model: OTHER })).details.family, "llama");
    // Anthropic's route is dispatched by its body's model too.
    const msg = await (await fetch(server.base + "/v1/messages", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: STEM,
        max_tokens: 4,
        messages: [{ role: "user", content: "Hi" }],
      }),
    })).json();
    assertEquals([msg.type, msg.model, msg.usage.output_tokens], ["message", STEM, 4]);
    const unknown = await raw(server.base, "/api/chat", { model: "llama3", messages: MESSAGES });
    assertEquals(unknown.status, 404);
    assertOllamaError(unknown.body, /"llama3" does not exist/);
  } finally {
    server.child.kill("SIGTERM");
    await server.log();
  }
});
