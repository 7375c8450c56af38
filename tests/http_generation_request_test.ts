import { assertEquals, assertMatch, assertThrows } from "@std/assert";
import { ApiError } from "../lib/http/errors.ts";
import { buildGenerationRequest } from "../lib/http/generation_request.ts";

/** One id per character (its code), and remembers how it was asked to tokenize. */
function countingBackend() {
  const calls: { bos: boolean; special: boolean }[] = [];
  return {
    calls,
    contextLength: 100,
    vocabSize: 512,
    tokenize: (text: string, opts: { bos: boolean; special: boolean }) => {
      calls.push(opts);
      return [...text].map((ch) => ch.charCodeAt(0));
    },
  };
}

Deno.test("buildGenerationRequest() tokenizes the prompt once, with BOS, reading control tokens only in template-rendered prompts", () => {
  for (const specialTokens of [true, false]) {
    const backend = countingBackend();
    const { request, promptTokens } = buildGenerationRequest(
      { prompt: "<s>hi</s>", promptParam: "messages", specialTokens },
      backend,
      "r1",
    );
    assertEquals(backend.calls, [{ bos: true, special: specialTokens }], "tokenized once");
    assertEquals(request.prompt, [..."<s>hi</s>"].map((ch) => ch.charCodeAt(0)));
    assertEquals(promptTokens, 9);
  }
  const backend = countingBackend();
  buildGenerationRequest({ prompt: "<s>hi", promptParam: "prompt" }, backend, "r2");
  assertEquals(
    backend.calls,
    [{ bos: true, special: false }],
    "a client's own text never becomes control tokens",
  );
});

Deno.test("buildGenerationRequest() refuses a prompt that cannot fit from its length alone, without tokenizing it", () => {
  let counted = 0;
  const backend = {
    contextLength: 512,
    vocabSize: 512,
    // Longest token 10 bytes: 0.85 MB of text is at least 85,000 tokens.
    minTokens: (text: string) => Math.floor(text.length / 10),
    tokenize: (text: string) => (counted++, [...text].map(() => 7)),
  };
  const big = "a".repeat(850_000);
  const err = assertThrows(
    () => buildGenerationRequest({ prompt: big, promptParam: "prompt" }, backend, "r1"),
    ApiError,
  );
  assertEquals(err.code, "context_length_exceeded");
  assertMatch(err.message, /at least 85000 tokens \(850000 characters\).* context is 512/);
  assertEquals(counted, 0, "never tokenized");
  // Under the bound the exact count decides, as before.
  buildGenerationRequest({ prompt: "a".repeat(100), promptParam: "prompt" }, backend, "r2");
  assertEquals(counted, 1);
});
