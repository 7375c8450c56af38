import { assert, assertEquals } from "@std/assert";
import {
  grammarVocabulary,
  grammarVocabularyInSlices,
  longestToken,
  tokenBytes,
} from "../lib/grammar/grammar_vocabulary.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { compatPath } from "./harness/compat.ts";

const model = await loadModel(compatPath("qwen2-like-q4_k_m"));
const tokenizer = new Tokenizer(model.tokenizer!);
const vocabSize = model.config.vocabSize;

Deno.test("the packed vocabulary holds every printed token's bytes as the tokenizer decodes them, specials empty, in shared memory", () => {
  const v = grammarVocabulary(tokenizer, vocabSize);
  assertEquals(v.offsets.length, vocabSize + 1);
  assert(
    v.bytes.buffer instanceof SharedArrayBuffer && v.offsets.buffer instanceof SharedArrayBuffer,
  );
  let longest = 1;
  for (let id = 0; id < vocabSize; id++) {
    const want = id < tokenizer.vocabSize && !tokenizer.isSpecial(id)
      ? tokenizer.tokenBytes(id)
      : new Uint8Array(0);
    assertEquals(tokenBytes(v, id), want, `token ${id}`);
    longest = Math.max(longest, want.length);
  }
  assertEquals(longestToken(v), longest);
  assertEquals(v.stopIds, [...tokenizer.eogIds].sort((a, b) => a - b));
});

Deno.test("the vocabulary packed in slices is the same, and timers run between its slices", async () => {
  let ticks = 0;
  const timer = setInterval(() => ticks++, 0);
  const sliced = await grammarVocabularyInSlices(tokenizer, vocabSize, 4096);
  clearInterval(timer);
  const whole = grammarVocabulary(tokenizer, vocabSize);
  assertEquals(sliced.offsets, whole.offsets);
  assertEquals(sliced.bytes, whole.bytes);
  assert(ticks >= 2, `an interval fired ${ticks} times while ${vocabSize} tokens were packed`);
});
