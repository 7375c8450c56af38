import { assertEquals } from "@std/assert";
import {
  completionRoom,
  outsideVocabulary,
  promptProblem,
  vocabularyProblem,
} from "../lib/core/prompt_check.ts";

Deno.test("outsideVocabulary(): the first id that is not an integer in 0..vocab-1", () => {
  assertEquals(outsideVocabulary([0, 1, 7], 8), -1);
  assertEquals(outsideVocabulary([0, 8, 9], 8), 1);
  assertEquals(outsideVocabulary([3, -1], 8), 1);
  assertEquals(outsideVocabulary([2.5], 8), 0);
  assertEquals(outsideVocabulary([], 8), -1);
});

Deno.test("vocabularyProblem(): names the id, its index and the range; an unknown vocabulary is not checked", () => {
  assertEquals(
    vocabularyProblem([5, 512, 600], 512),
    "token id 512 at index 1 is outside the model's vocabulary of 512 ids (0 to 511)",
  );
  assertEquals(vocabularyProblem([511], 512), undefined);
  assertEquals(vocabularyProblem([99999], undefined), undefined);
});

Deno.test("promptProblem(): at least one position must be left for the completion", () => {
  // A context of 4 takes a prompt of 3 (one position left), not of 4.
  assertEquals(completionRoom(3, 4), 1);
  assertEquals(promptProblem([1, 2, 3], { contextLength: 4, vocabSize: 8 }), undefined);
  assertEquals(promptProblem(3, { contextLength: 4 }), undefined);
  assertEquals(promptProblem([1, 2, 3, 4], { contextLength: 4, vocabSize: 8 }), {
    code: "context_length_exceeded",
    message:
      "The prompt is 4 tokens but the model's context is 4 tokens, which leaves no room for a completion; shorten it to at most 3 tokens",
  });
  assertEquals(
    promptProblem(40, { contextLength: 32, holder: "the KV cache" })?.message,
    "The prompt is 40 tokens but the KV cache is 32 tokens, which leaves no room for a completion; shorten it to at most 31 tokens",
  );
});

Deno.test("promptProblem(): a token outside the vocabulary is reported before the length, and only for ids", () => {
  assertEquals(promptProblem([1, 9, 2, 3, 4], { contextLength: 4, vocabSize: 8 }), {
    code: "invalid_request",
    message: "token id 9 at index 1 is outside the model's vocabulary of 8 ids (0 to 7)",
  });
  // A count (text not yet tokenized) has no ids to check.
  assertEquals(promptProblem(2, { contextLength: 4, vocabSize: 8 }), undefined);
});
