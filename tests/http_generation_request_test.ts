import { assertEquals } from "@std/assert";
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
