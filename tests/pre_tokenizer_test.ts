/** Pre-tokenizer splits worked out by hand from the regexes in llama.cpp's llama-vocab.cpp. */
import { assertEquals, assertThrows } from "@std/assert";
import { preTokenizer, SUPPORTED_PRE_TOKENIZERS } from "../lib/tokenizer/pre_tokenizer.ts";

const split = (pre: string, text: string) => preTokenizer(pre).split(text);

Deno.test("llama-bpe: contractions of any case, letters with one leading non-letter, numbers in threes", () => {
  assertEquals(split("llama-bpe", "don't won't I'M"), ["don", "'t", " won", "'t", " I", "'M"]);
  assertEquals(split("llama-bpe", "1234567 x"), ["123", "456", "7", " x"]);
  assertEquals(split("llama-bpe", "$5.99!"), ["$", "5", ".", "99", "!"]);
  assertEquals(split("llama-bpe", "(hello)"), ["(hello", ")"]);
});

Deno.test("llama-bpe: whitespace runs leave their last space to the next word; newlines gather", () => {
  assertEquals(split("llama-bpe", "x   y"), ["x", "  ", " y"]);
  assertEquals(split("llama-bpe", "  leading"), [" ", " leading"]);
  assertEquals(split("llama-bpe", "a \n\n b"), ["a", " \n\n", " b"]);
  assertEquals(split("llama-bpe", "end  "), ["end", "  "]);
  assertEquals(split("llama-bpe", "hi!!\n\nyou"), ["hi", "!!\n\n", "you"]);
  assertEquals(split("llama-bpe", "\tindented"), ["\tindented"]);
});

Deno.test("llama-bpe: non-Latin letters, accents and emoji", () => {
  assertEquals(split("llama-bpe", "日本語 🦙 naïve"), ["日本語", " 🦙", " naïve"]);
  // U+3000 (ideographic space) is whitespace, U+FEFF is not (llama.cpp's set, not JS's \s).
  assertEquals(split("llama-bpe", "a\u3000b"), ["a", "\u3000b"]);
  assertEquals(split("llama-bpe", "a\uFEFFb"), ["a", "\uFEFFb"]);
});

Deno.test("qwen2: like llama-bpe but every digit alone", () => {
  assertEquals(split("qwen2", "x = 2024!"), ["x", " =", " ", "2", "0", "2", "4", "!"]);
  assertEquals(split("qwen2", "don't"), ["don", "'t"]);
  assertEquals(split("qwen2", "a   b"), split("llama-bpe", "a   b"));
});

Deno.test("gpt-2: lower-case contractions only, numbers whole, a space joins the next word", () => {
  assertEquals(split("gpt-2", "I'M don't 2024"), ["I", "'", "M", " don", "'t", " 2024"]);
  assertEquals(split("gpt-2", "a  b"), ["a", " ", " b"]);
  assertEquals(split("gpt2", "hi!!"), ["hi", "!!"]);
});

Deno.test("smollm: digits cut out first, then GPT-2's split", () => {
  assertEquals(split("smollm", "x 123"), ["x", " ", "1", "2", "3"]);
  assertEquals(split("smollm", "ab12cd"), ["ab", "1", "2", "cd"]);
});

Deno.test("default: punctuation runs, then GPT-2's split, then numbers cut in threes", () => {
  assertEquals(split("default", "a+b=1234"), ["a", "+", "b", "=", "123", "4"]);
  assertEquals(split("default", "hi, you"), ["hi", ",", " you"]);
  assertEquals(
    preTokenizer(undefined).name,
    "default",
    "a missing pre means default, as in llama.cpp",
  );
});

Deno.test("every split gives the text back", () => {
  const texts = [
    "  leading spaces\n\nand  newlines\n\tindented",
    "x = [1, 22, 333] # numbers 4567",
    "日本語 🦙 naïve café",
    " \r\n \t ",
  ];
  for (const pre of SUPPORTED_PRE_TOKENIZERS) {
    for (const t of texts) assertEquals(split(pre, t).join(""), t, `${pre}: ${JSON.stringify(t)}`);
  }
});

Deno.test("an unknown pre-tokenizer is refused by name, with the supported ones listed", () => {
  assertThrows(
    () => preTokenizer("klingon"),
    Error,
    "pre-tokenizer 'klingon' (tokenizer.ggml.pre) is not supported (supported: llama-bpe",
  );
});
