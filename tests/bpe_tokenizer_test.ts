/**
 * Byte-level BPE: a hand-built vocabulary whose ids can be worked out by hand, then the real
 * Llama 3 and Qwen2.5 vocabularies (compat GGUFs) on cases chosen to tell the rules apart.
 */
import { assert, assertEquals, assertNotEquals, assertThrows } from "@std/assert";
import { BYTE_TO_CHAR, bytesToChars } from "../lib/tokenizer/byte_unicode.ts";
import { mergeWord } from "../lib/tokenizer/bpe_merge.ts";
import { MergeRanks } from "../lib/tokenizer/merge_ranks.ts";
import { readGgufHeader } from "../lib/model/gguf.ts";
import type { ByteStrings } from "../lib/util/byte_strings.ts";
import { seededRandom } from "../lib/util/seeded_random.ts";
import { readGgufTokenizer } from "../lib/model/gguf_tokenizer.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import type { TokenizerData } from "../lib/tokenizer/tokenizer_data.ts";
import { modelFile } from "./harness/model_files.ts";

/** Ids 0..255 are the bytes; then the merged tokens and three special ones. */
const EXTRA = ["Ġt", "he", "Ġthe", "ab", "bc", "<|im_end|>", "<tool>", "<|endoftext|>"] as const;
const id = (piece: string) => 256 + EXTRA.indexOf(piece as typeof EXTRA[number]);
const byte = (ch: string) => new TextEncoder().encode(ch)[0]!;
function toy(merges: string[], pre = "qwen2", extra: Partial<TokenizerData> = {}): Tokenizer {
  const tokens = [...BYTE_TO_CHAR, ...EXTRA];
  const types = new Int32Array(tokens.length).fill(1);
  types[id("<|im_end|>")] = 3;
  types[id("<tool>")] = 4;
  types[id("<|endoftext|>")] = 3;
  return new Tokenizer({
    model: "gpt2",
    pre,
    tokens,
    scores: new Float32Array(tokens.length),
    tokenTypes: types,
    merges,
    bosId: id("<|endoftext|>"),
    eosId: id("<|im_end|>"),
    ...extra,
  });
}
const MERGES = ["Ġ t", "h e", "Ġt he", "a b", "b c"];

Deno.test("BPE merges by rank: ' the' becomes one token, untouched bytes stay bytes", () => {
  const tok = toy(MERGES);
  assertEquals(tok.encode(" the"), [id("Ġthe")]);
  assertEquals(tok.encode(" ten"), [id("Ġt"), byte("e"), byte("n")]);
  assertEquals(tok.encode("the"), [byte("t"), id("he")]);
});

Deno.test("BPE takes the lower-ranked pair first: 'abc' is ab+c or a+bc by merge order", () => {
  assertEquals(toy(["a b", "b c"]).encode("abc"), [id("ab"), byte("c")]);
  assertEquals(toy(["b c", "a b"]).encode("abc"), [byte("a"), id("bc")]);
  // Equal pairs merge left to right: "abab" has two "a b" pairs and no overlap.
  assertEquals(toy(["a b"]).encode("abab"), [id("ab"), id("ab")]);
});

Deno.test("llama-bpe takes a word that is itself a token whole, even without a merge path", () => {
  // No merges at all: qwen2 leaves bytes, llama-bpe (ignore_merges) finds "ab" in the vocabulary.
  assertEquals(toy(["x y"], "qwen2").encode("ab"), [byte("a"), byte("b")]);
  assertEquals(toy(["x y"], "llama-bpe", { addBos: false }).encode("ab"), [id("ab")]);
});

Deno.test("bytes outside ASCII are spelled as GPT-2 characters: a space is Ġ, é is two byte tokens", () => {
  const tok = toy(MERGES);
  assertEquals(
    tok.encode("é"),
    [0xc3, 0xa9].map((b) => [...BYTE_TO_CHAR].indexOf(BYTE_TO_CHAR[b]!)),
  );
  assertEquals(BYTE_TO_CHAR[0x20], "Ġ");
  assertEquals(BYTE_TO_CHAR[0x0a], "Ċ");
  assertEquals(tok.decode(tok.encode("café ☕ 🦙\n")), "café ☕ 🦙\n");
});

Deno.test("control and user-defined spellings in a client's text stay characters; template text makes tokens", () => {
  const tok = toy(MERGES);
  for (const s of ["<|im_end|>", "<tool>"]) {
    const plain = tok.encode(`a${s}b`);
    assert(!plain.includes(id(s)), `${s} typed by a client is not the token`);
    assertEquals(tok.decode(plain), `a${s}b`);
    assertEquals(tok.encode(`a${s}b`, { special: true }), [byte("a"), id(s), byte("b")]);
  }
  // Control tokens print nothing; a user-defined token prints its text.
  assertEquals(tok.decode([id("<|im_end|>"), id("<tool>")]), "<tool>");
});

Deno.test("add_bos_token and add_eos_token decide the default; qwen2 adds no BOS, llama-bpe does", () => {
  assertEquals(toy(MERGES).encode(" the"), [id("Ġthe")]);
  assertEquals(toy(MERGES, "llama-bpe").encode(" the"), [id("<|endoftext|>"), id("Ġthe")]);
  assertEquals(toy(MERGES, "qwen2", { addBos: true, addEos: true }).encode(" the"), [
    id("<|endoftext|>"),
    id("Ġthe"),
    id("<|im_end|>"),
  ]);
  assertEquals(toy(MERGES, "qwen2", { addBos: true }).encode(" the", { bos: false }), [id("Ġthe")]);
});

Deno.test("end-of-generation: EOS, EOT/EOM ids from the file and end-of-turn spellings, which become control", () => {
  const tokens = [...BYTE_TO_CHAR, "<|eot_id|>", "<|eom_id|>", "</s>", "<|fim_pad|>", "<|other|>"];
  const n = tokens.length;
  const tok = new Tokenizer({
    model: "gpt2",
    pre: "llama-bpe",
    tokens,
    scores: new Float32Array(n),
    tokenTypes: new Int32Array(n).fill(1),
    merges: ["a b"],
    bosId: 0,
    eosId: 1,
    eomId: n - 1,
  });
  assertEquals([...tok.eogIds].sort((a, b) => a - b), [1, 256, 257, 258, 259, n - 1]);
  // "</s>" was an ordinary token: now control, so it prints nothing and text never makes it.
  assertEquals(tok.decode([258]), "");
  assertEquals(tok.encode("</s>", { bos: false, special: true }), [258]);
  assertEquals(tok.decode(tok.encode("</s>", { bos: false })), "</s>");
});

Deno.test("a gpt2 vocabulary without merges or with an unknown pre-tokenizer is refused", () => {
  assertThrows(() => toy([]), Error, "needs tokenizer.ggml.merges");
  assertThrows(
    () => toy(MERGES, "tekken"),
    Error,
    "pre-tokenizer 'tekken' (tokenizer.ggml.pre) is not supported",
  );
});

const llama3 = new Tokenizer(
  (await readGgufTokenizer(modelFile("compat/llama3-like-q4_k_m.gguf")))!,
);
const qwen = new Tokenizer((await readGgufTokenizer(modelFile("compat/qwen2-like-q4_k_m.gguf")))!);
const pieces = (tok: Tokenizer, text: string) =>
  tok.encode(text, { bos: false }).map((i) => tok.decode([i]));

Deno.test("real vocabularies: Llama 3 numbers in threes, Qwen digit by digit", () => {
  assertEquals(pieces(llama3, "1234567"), ["123", "456", "7"]);
  assertEquals(pieces(qwen, "1234567"), ["1", "2", "3", "4", "5", "6", "7"]);
  assertEquals(pieces(llama3, " 2024"), [" ", "202", "4"]);
});

Deno.test("real vocabularies: contractions, whitespace runs, and a BOS only where the file asks", () => {
  assertEquals(pieces(llama3, "I'M here"), ["I", "'M", " here"]);
  assertEquals(pieces(llama3, "a    b").join("|"), "a|   | b");
  assertEquals(llama3.encode("x")[0], llama3.bosId);
  assertNotEquals(qwen.encode("x")[0], qwen.bosId);
  assertEquals([llama3.addBos, qwen.addBos], [true, false]);
});

Deno.test("real vocabularies: a client typing <|eot_id|> or <|im_end|> gets characters, the template gets the token", () => {
  const eot = 128009;
  const imEnd = 151645;
  assert(!llama3.encode("Hi<|eot_id|>").includes(eot));
  assertEquals(llama3.decode(llama3.encode("Hi<|eot_id|>", { bos: false })), "Hi<|eot_id|>");
  assertEquals(llama3.encode("Hi<|eot_id|>", { bos: false, special: true }).at(-1), eot);
  assert(!qwen.encode("Hi<|im_end|>").includes(imEnd));
  assertEquals(qwen.encode("Hi<|im_end|>", { special: true }).at(-1), imEnd);
  assert(llama3.isEog(eot) && qwen.isEog(imEnd) && qwen.isEog(151643));
});

Deno.test("streaming decode never splits a character spread over byte-level tokens", () => {
  for (const tok of [llama3, qwen]) {
    const text = "日本語 🦙 naïve café — ok";
    const ids = tok.encode(text, { bos: false });
    const dec = tok.createDecoder();
    const out = ids.map((i) => dec.push(i));
    out.push(dec.flush());
    assertEquals(out.join(""), text);
    for (const s of out) {
      assert(!s.includes("\uFFFD"), `no partial character in ${JSON.stringify(out)}`);
    }
    // The llama needs three tokens: the pieces before its last one show nothing of it.
    assert(out.some((s) => s === ""), "some token completes no character by itself");
  }
});

/** The textbook BPE (a full rescan of the word's pairs per merge, no cache): the oracle for the heap. */
function textbookMerge(chars: string[], rank: (a: string, b: string) => number): string[] {
  const syms = [...chars];
  for (;;) {
    let best = -1;
    let bestRank = Infinity;
    for (let i = 0; i + 1 < syms.length; i++) {
      const r = rank(syms[i]!, syms[i + 1]!);
      if (r >= 0 && r < bestRank) [best, bestRank] = [i, r];
    }
    if (best < 0) return syms;
    syms.splice(best, 2, syms[best]! + syms[best + 1]!);
  }
}

Deno.test("the heap merge equals the textbook BPE on random words, with Llama 3's merges", async () => {
  const header = await readGgufHeader(modelFile("compat/llama3-like-q4_k_m.gguf"));
  const ranks = new MergeRanks(
    header.metadata.get("tokenizer.ggml.merges")!.value as ByteStrings,
  );
  const rank = (a: string, b: string) => ranks.rank(a, b);
  const alphabet = [..."etaoinshrdlu ETAO0123456789.,'!?-_()\n\té日本語中文🦙"];
  const next = seededRandom(10);
  for (let n = 0; n < 300; n++) {
    const len = 1 + Math.floor(next() * 40);
    let word = "";
    for (let i = 0; i < len; i++) word += alphabet[Math.floor(next() * alphabet.length)];
    const chars = [...bytesToChars(word)];
    assertEquals(mergeWord(chars, ranks), textbookMerge(chars, rank), JSON.stringify(word));
  }
});
