import { assertEquals, assertMatch, assertThrows } from "@std/assert";
import { ApiError } from "../lib/http/errors.ts";
import { buildGenerationRequest } from "../lib/http/generation_request.ts";

/** Counts characters, and remembers how it was asked to count. */
function countingBackend() {
  const calls: boolean[] = [];
  return {
    calls,
    contextLength: 100,
    vocabSize: 512,
    countTokens: (text: string, opts?: { special?: boolean }) => {
      calls.push(opts?.special ?? false);
      return text.length;
    },
  };
}

Deno.test("buildGenerationRequest() parses control tokens only for template-rendered prompts", () => {
  for (const specialTokens of [true, false]) {
    const backend = countingBackend();
    const { request } = buildGenerationRequest(
      { prompt: "<s>hi</s>", promptParam: "messages", specialTokens },
      backend,
      "r1",
    );
    assertEquals(request.parseSpecialTokens, specialTokens);
    assertEquals(
      backend.calls,
      [specialTokens],
      "the prompt is counted the way it will be encoded",
    );
  }
  const { request } = buildGenerationRequest(
    { prompt: "<s>hi", promptParam: "prompt" },
    countingBackend(),
    "r2",
  );
  assertEquals(
    request.parseSpecialTokens,
    false,
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
    countTokens: (text: string) => (counted++, text.length),
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
