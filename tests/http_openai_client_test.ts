// deno-lint-ignore no-import-prefix -- not in the import map (deno.json is the lead's); pinned here
import OpenAI from "npm:openai@7.59.0";
import { assertEquals, assertInstanceOf, assertMatch, assertRejects } from "@std/assert";
import { startService, type TestService, waitUntil } from "./_http_harness.ts";

/** The fake model's text for the prompt alone, under the sampling of the latest request. */
function expectedText(svc: TestService, prompt: string, seed: number, n: number): string {
  const sampling = svc.backend.requests.at(-1)!.sampling;
  assertEquals(sampling.seed, seed, "the request's seed reached the core");
  return svc.backend.continuation(prompt, n, sampling).text;
}

function client(base: string, apiKey = "unused", maxRetries = 0): OpenAI {
  return new OpenAI({ baseURL: base + "/v1", apiKey, maxRetries });
}

const CHAT_PROMPT = "System: Be brief.\nUser: Tell me a story\nAssistant:";
const MESSAGES = [
  { role: "system" as const, content: "Be brief." },
  { role: "user" as const, content: "Tell me a story" },
];

Deno.test("the openai client's chat.completions.create works non-streaming", async () => {
  await using svc = await startService({}, { apiKeys: ["sk-test"] });
  const out = await client(svc.base, "sk-test").chat.completions.create({
    model: "fake-llama",
    messages: MESSAGES,
    max_tokens: 8,
    seed: 42,
    temperature: 0.2,
  });
  assertEquals(out.object, "chat.completion");
  assertEquals(out.choices[0]!.message.role, "assistant");
  assertEquals(out.choices[0]!.message.content, expectedText(svc, CHAT_PROMPT, 42, 8));
  assertEquals(out.choices[0]!.finish_reason, "length");
  // CHAT_PROMPT in tok512 (run.c's encoding): BOS and 36 pieces.
  assertEquals(out.usage?.prompt_tokens, 37);
  assertEquals(out.usage?.completion_tokens, 8);
  assertEquals(out.usage?.total_tokens, 37 + 8);
});

Deno.test("the openai client streams chat completions with usage", async () => {
  await using svc = await startService({ tokenDelayMs: 2 });
  const stream = await client(svc.base).chat.completions.create({
    model: "fake-llama",
    messages: MESSAGES,
    max_tokens: 6,
    seed: 5,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let finish: string | null = null;
  let usage: OpenAI.CompletionUsage | null | undefined;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    text += chunk.choices[0]?.delta.content ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
    if (chunk.usage) usage = chunk.usage;
  }
  assertEquals(text, expectedText(svc, CHAT_PROMPT, 5, 6));
  assertEquals(finish, "length");
  assertEquals(usage?.completion_tokens, 6);
  assertEquals(chunks, 1 + 6 + 1 + 1); // role, tokens, finish, usage
});

Deno.test("the openai client's completions.create works, streaming and not", async () => {
  await using svc = await startService({ tokenDelayMs: 1 });
  const c = client(svc.base);
  const one = await c.completions.create({
    model: "fake-llama",
    prompt: "Once upon a time",
    max_tokens: 5,
    seed: 8,
  });
  assertEquals(one.choices[0]!.text, expectedText(svc, "Once upon a time", 8, 5));
  assertEquals(one.usage?.completion_tokens, 5);
  const stream = await c.completions.create({
    model: "fake-llama",
    prompt: "Once upon a time",
    max_tokens: 5,
    seed: 8,
    stream: true,
  });
  let text = "";
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
  assertEquals(text, one.choices[0]!.text);
  const models = await c.models.list();
  assertEquals(models.data.map((m) => m.id), ["fake-llama"]);
});

Deno.test("the openai client surfaces our errors as its typed errors", async () => {
  await using svc = await startService(
    { tokenDelayMs: 10, maxRunning: 1, maxWaiting: 0, contextLength: 4096 },
    { apiKeys: ["sk-right"] },
  );
  const bad = await assertRejects(
    () =>
      client(svc.base, "sk-right").chat.completions.create({
        model: "fake-llama",
        messages: MESSAGES,
        temperature: 3,
      }),
    OpenAI.BadRequestError,
  );
  assertEquals(bad.status, 400);
  assertEquals(bad.param, "temperature");
  assertMatch(bad.message, /got 3/);
  await assertRejects(
    () => client(svc.base, "sk-wrong").models.list(),
    OpenAI.AuthenticationError,
  );
  // Overloaded: hold the only slot with one stream, the next request gets 503.
  const holder = await client(svc.base, "sk-right").chat.completions.create({
    model: "fake-llama",
    messages: MESSAGES,
    max_tokens: 2000,
    stream: true,
  });
  const it = holder[Symbol.asyncIterator]();
  await it.next();
  const err = await assertRejects(() =>
    client(svc.base, "sk-right").chat.completions.create({
      model: "fake-llama",
      messages: MESSAGES,
    })
  );
  assertInstanceOf(err, OpenAI.APIError);
  assertEquals(err.status, 503);
  assertEquals(err.headers?.get("retry-after"), "1");
  holder.controller.abort();
  await it.return?.();
  await waitUntil(() => svc.backend.active === 0, "the held stream to be released");
});

Deno.test("the openai client works with a served model name other than the file's stem; an unknown name is 404 model_not_found", async () => {
  await using svc = await startService({ modelName: "stories260K" }, {
    servedModelNames: ["gpt-4o-mini", "my-llama"],
  });
  const c = client(svc.base);
  const models = [];
  for await (const m of c.models.list()) models.push(m.id);
  assertEquals(models, ["gpt-4o-mini", "my-llama"]);
  assertEquals((await c.models.retrieve("my-llama")).id, "my-llama");
  for (const model of ["gpt-4o-mini", "my-llama"]) {
    const out = await c.chat.completions.create({
      model,
      messages: MESSAGES,
      max_tokens: 4,
      seed: 9,
    });
    assertEquals(out.model, model);
    assertEquals(out.choices[0]!.message.content, expectedText(svc, CHAT_PROMPT, 9, 4));
  }
  // The file's stem is not a served name once names are given.
  const err = await assertRejects(
    () => c.completions.create({ model: "stories260K", prompt: "x", max_tokens: 1 }),
    OpenAI.NotFoundError,
  );
  assertEquals(err.status, 404);
  assertEquals((err.error as { code?: string }).code, "model_not_found");
  assertMatch(err.message, /"gpt-4o-mini", "my-llama"/);
});
