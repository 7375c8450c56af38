import { assert, assertGreater } from "@std/assert";
import { parseLlama2cTokenizer } from "../lib/tokenizer/llama2c_tokenizer.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { PromptTokens } from "../lib/backend/prompt_tokens.ts";
import { modelFile } from "./harness/model_files.ts";
import { seeded } from "./_fuzz_cases.ts";

const tok512 = new Tokenizer(
  parseLlama2cTokenizer(await Deno.readFile(modelFile("tok512.bin")), 512, "tok512.bin"),
);

Deno.test("PromptTokens.minTokens() never exceeds the real token count (prose, spaces, CJK, emoji, control-token text)", () => {
  const text = new PromptTokens(tok512);
  const rand = seeded(13);
  const alphabet = [
    "Once upon a time ",
    "   ",
    "\n",
    "é",
    "日本語",
    "😀",
    "<s>",
    "</s>",
    "the",
    "x",
  ];
  for (let i = 0; i < 300; i++) {
    const n = 1 + Math.floor(rand() * 200);
    const s = Array.from({ length: n }, () => alphabet[Math.floor(rand() * alphabet.length)]).join(
      "",
    );
    for (const special of [false, true]) {
      const real = text.countTokens(s, { special });
      assert(text.minTokens(s) <= real, `${text.minTokens(s)} > ${real} for ${JSON.stringify(s)}`);
    }
  }
  // And it is a useful bound: a long prose prompt is bounded well above nothing.
  assertGreater(text.minTokens("Once upon a time ".repeat(1000)), 1000);
});

Deno.test("PromptTokens.tokenize() with special pieces and no BOS keeps a typed <s> (llama-server's parse_special)", async () => {
  const { loadModel } = await import("../lib/model/load_model.ts");
  const { assertEquals } = await import("@std/assert");
  const model = await loadModel(modelFile("compat/tinyllama-like-q4_0.gguf"));
  const tok = new Tokenizer(model.tokenizer!);
  const text = new PromptTokens(tok);
  // llama-server on this vocabulary: POST /tokenize {"content": "<s>Hi", "parse_special": true}.
  assertEquals(text.tokenize("<s>Hi", { bos: false, special: true }), [1, 6324]);
  assertEquals(text.tokenize("<s>Hi", { bos: false, special: true }), [
    tok.bosId,
    ...tok.encode("Hi", { bos: false }),
  ]);
  // Without parse_special the same text is characters.
  assertEquals(text.tokenize("<s>Hi", { bos: false, special: false }).includes(tok.bosId), false);
});
