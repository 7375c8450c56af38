// deno-lint-ignore-file no-explicit-any
/** Completions' `echo`: the prompt's text before each choice's, streaming and not. */
import { assertEquals, assertMatch } from "@std/assert";
import { parseSse, postJson, startService } from "./_http_harness.ts";

const PROMPT = "Once upon a time";

Deno.test("echo: true puts the prompt before the completion, streaming and not, for every choice", async () => {
  await using svc = await startService();
  const want = svc.backend.continuation(PROMPT, 8).text;
  const res = await postJson(svc.base + "/v1/completions", {
    prompt: PROMPT,
    max_tokens: 8,
    temperature: 0,
    echo: true,
    n: 2,
  });
  assertEquals(res.status, 200);
  const json = await res.json();
  assertEquals(json.choices.map((c: any) => c.text), [PROMPT + want, PROMPT + want]);
  // The usage counts generated tokens only.
  assertEquals(json.usage.completion_tokens, 2 * svc.backend.continuation(PROMPT, 8).ids.length);
  const events = parseSse(
    await (await postJson(svc.base + "/v1/completions", {
      prompt: PROMPT,
      max_tokens: 8,
      temperature: 0,
      echo: true,
      stream: true,
    })).text(),
  ).slice(0, -1) as any[];
  assertEquals(events[0].choices[0].text, PROMPT, "the first chunk is the prompt");
  assertEquals(events.map((e) => e.choices[0].text).join(""), PROMPT + want);
  // echo: false is the plain completion.
  const plain = await (await postJson(svc.base + "/v1/completions", {
    prompt: PROMPT,
    max_tokens: 8,
    temperature: 0,
    echo: false,
  })).json();
  assertEquals(plain.choices[0].text, want);
});

Deno.test("echo of a token-id prompt is its text", async () => {
  await using svc = await startService();
  const ids = svc.backend.tokenize(PROMPT, { bos: true, special: false });
  const json = await (await postJson(svc.base + "/v1/completions", {
    prompt: ids,
    max_tokens: 4,
    temperature: 0,
    echo: true,
  })).json();
  assertEquals(
    json.choices[0].text,
    svc.backend.detokenize(ids) + svc.backend.continuation(ids, 4).text,
  );
});

Deno.test("echo with logprobs is refused with a 400 naming echo: the prompt tokens' logprobs are not computed", async () => {
  await using svc = await startService();
  const res = await postJson(svc.base + "/v1/completions", {
    prompt: PROMPT,
    echo: true,
    logprobs: 0,
  });
  const err = (await res.json()).error;
  assertEquals([res.status, err.param], [400, "echo"]);
  assertMatch(err.message, /prompt tokens' logprobs, which this server does not compute/);
  assertEquals(svc.backend.requests.length, 0);
});
