// deno-lint-ignore-file no-explicit-any
/**
 * `n` choices on both endpoints: distinct seeds derived from the request's, each choice the
 * fake model's continuation for its seed, streaming chunks tagged with their index, usage
 * summed, and the prompt's KV blocks shared through the prefix cache.
 */
import { assert, assertEquals, assertNotEquals } from "@std/assert";
import { choiceRequests, choiceSeed } from "../lib/http/choices.ts";
import { seedToU32 } from "../lib/util/rng.ts";
import { parseSse, postJson, startService } from "./_http_harness.ts";
import type { GenerationRequest } from "../lib/core/generation.ts";

const SAMPLED = { temperature: 0.9, topK: 0, topP: 1, minP: 0 };

Deno.test("choiceSeed() keeps the request's seed for choice 0 and derives distinct, repeatable seeds for the others", () => {
  assertEquals(choiceSeed(1234, 0), 1234);
  const seeds = Array.from({ length: 16 }, (_, i) => choiceSeed(1234, i));
  assertEquals(new Set(seeds).size, 16);
  assertEquals(seeds, Array.from({ length: 16 }, (_, i) => choiceSeed(1234, i)));
  assertNotEquals(choiceSeed(1235, 3), choiceSeed(1234, 3));
  const req = { requestId: "r", sampling: { ...SAMPLED, seed: 7 } } as GenerationRequest;
  const reqs = choiceRequests(req, 3);
  assertEquals(reqs[0], req);
  assertEquals(reqs.map((r) => [r.requestId, r.sampling.seed]), [["r", 7], [
    "r/1",
    choiceSeed(7, 1),
  ], ["r/2", choiceSeed(7, 2)]]);
});

Deno.test("POST /v1/completions with n: 3 answers 3 indexed choices, each the fake model's continuation for its choice's seed, usage summed", async () => {
  await using svc = await startService();
  const body = { prompt: "Once upon a time", max_tokens: 12, temperature: 0.9, seed: 42, n: 3 };
  const res = await postJson(svc.base + "/v1/completions", body);
  assertEquals(res.status, 200);
  const json = await res.json();
  assertEquals(json.choices.map((c: any) => c.index), [0, 1, 2]);
  const want = [0, 1, 2].map((i) =>
    svc.backend.continuation("Once upon a time", 12, {
      ...SAMPLED,
      seed: choiceSeed(seedToU32(42), i),
    })
  );
  assertEquals(json.choices.map((c: any) => c.text), want.map((w) => w.text));
  assertEquals(new Set(want.map((w) => w.text)).size, 3, "the choices differ");
  assertEquals(json.usage.completion_tokens, want.reduce((n, w) => n + w.ids.length, 0));
  // "Once upon a time" is 5 tokens with BOS: 1, 403, 407, 261, 378 (../shared/models/README.md).
  assertEquals(json.usage.prompt_tokens, 5);
  // Choice 0 is what the same request with n: 1 gives.
  const one = await (await postJson(svc.base + "/v1/completions", { ...body, n: 1 })).json();
  assertEquals(one.choices.map((c: any) => c.text), [want[0]!.text]);
});

Deno.test("streaming with n: 3: every chunk names its choice, each choice's text and finish chunk arrive, and one usage chunk sums them", async () => {
  await using svc = await startService();
  for (
    const [path, extra] of [
      ["/v1/completions", { prompt: "Once upon a time" }],
      ["/v1/chat/completions", { messages: [{ role: "user", content: "Tell me a story" }] }],
    ] as const
  ) {
    const body = {
      ...extra,
      max_tokens: 10,
      temperature: 0.9,
      seed: 5,
      n: 3,
      stream: true,
      stream_options: { include_usage: true },
    };
    const whole = await (await postJson(svc.base + path, { ...body, stream: false })).json();
    const events = parseSse(await (await postJson(svc.base + path, body)).text());
    assertEquals(events.at(-1), "[DONE]");
    const chunks = events.slice(0, -1) as any[];
    const usage = chunks.at(-1);
    assertEquals(usage.choices, []);
    assertEquals(usage.usage.completion_tokens, whole.usage.completion_tokens, path);
    const text = ["", "", ""], finishes = [0, 0, 0];
    for (const c of chunks.slice(0, -1)) {
      assertEquals(c.choices.length, 1);
      const ch = c.choices[0];
      text[ch.index] += ch.text ?? ch.delta?.content ?? "";
      if (ch.finish_reason !== null) finishes[ch.index]!++;
    }
    assertEquals(finishes, [1, 1, 1], path);
    assertEquals(text, whole.choices.map((c: any) => c.text ?? c.message.content), path);
  }
});

Deno.test("n: 4 shares the prompt's KV blocks: the other choices find every prompt token but the last in the prefix cache", async () => {
  await using svc = await startService({ contextLength: 256 });
  const prompt = "the dog ran to the park and the cat sat on the mat ".repeat(4);
  const promptTokens = svc.backend.tokenize(prompt, { bos: true, special: false }).length;
  const fullBlocks = Math.floor((promptTokens - 1) / 16);
  assert(fullBlocks >= 3, `the prompt spans ${fullBlocks} full blocks`);
  const before = svc.backend.serving.scheduler.stats();
  const res = await postJson(svc.base + "/v1/completions", {
    prompt,
    max_tokens: 6,
    temperature: 0.9,
    seed: 1,
    n: 4,
  });
  assertEquals(res.status, 200);
  const after = svc.backend.serving.scheduler.stats();
  // Choice 0 computes the prompt; choices 1-3 each find its full blocks cached, and all but the
  // last token of its partial tail (reuse goes to the token; one token is always computed).
  assertEquals(after.prefixHitTokens - before.prefixHitTokens, 3 * (promptTokens - 1));
  assertEquals(after.prefixQueryTokens - before.prefixQueryTokens, 4 * promptTokens);
});

Deno.test("n outside 1..16 is refused with a 400 naming it", async () => {
  await using svc = await startService();
  for (const n of [0, 17, 2.5]) {
    const res = await postJson(svc.base + "/v1/chat/completions", {
      messages: [{ role: "user", content: "x" }],
      n,
    });
    assertEquals([res.status, (await res.json()).error.param], [400, "n"]);
  }
});
