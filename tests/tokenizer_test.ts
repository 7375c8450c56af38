import { assert, assertEquals, assertThrows } from "@std/assert";
import { parseLlama2cTokenizer } from "../lib/tokenizer/llama2c_tokenizer.ts";
import { readGguf } from "../lib/model/gguf.ts";
import { ggufToModel } from "../lib/model/gguf_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import type { TokenizerData } from "../lib/model/weights.ts";
import { seededRandom } from "../lib/util/seeded_random.ts";

function modelsMirror(): string {
  const dir = Deno.env.get("MODEL_MIRROR");
  if (!dir) {
    throw new Error(
      "MODEL_MIRROR is unset: point it at the test models directory (e.g. ../shared/models)",
    );
  }
  return dir;
}

const llama2cData = parseLlama2cTokenizer(
  await Deno.readFile(`${modelsMirror()}/tok512.bin`),
  512,
  "tok512.bin",
);
const ggufData = ggufToModel(
  await readGguf(`${modelsMirror()}/stories260K.gguf`),
  "stories260K.gguf",
).tokenizer!;
const fromLlama2c = new Tokenizer(llama2cData);
const fromGguf = new Tokenizer(ggufData);
const both = [["tok512.bin", fromLlama2c], ["stories260K.gguf", fromGguf]] as const;

/**
 * A literal port of llama2.c run.c's `encode` (bytes, a sorted-vocabulary lookup of every
 * piece, byte fallback as id 3 + byte, BOS taking part in the merge scan, a full rescan per
 * merge). It is the oracle for the fast tokenizer; O(n^2), so only for short inputs.
 */
function runcEncode(data: TokenizerData, text: string, bos: boolean, eos: boolean): number[] {
  const bin = (b: Uint8Array) => String.fromCharCode(...b);
  const enc = new TextEncoder();
  const vocab = data.tokens.map((t) => bin(enc.encode(t)));
  const lookup = new Map<string, number>();
  vocab.forEach((t, i) => lookup.has(t) || lookup.set(t, i));
  const strLookup = (s: string) => lookup.get(s) ?? -1;
  const bytes = enc.encode(text);
  const tokens: number[] = [];
  if (bos) tokens.push(1);
  if (bytes.length > 0) tokens.push(strLookup(" "));
  let buf: number[] = [];
  for (let c = 0; c < bytes.length; c++) {
    if ((bytes[c]! & 0xc0) !== 0x80) buf = [];
    buf.push(bytes[c]!);
    const next = bytes[c + 1];
    if (next !== undefined && (next & 0xc0) === 0x80 && buf.length < 4) continue;
    const id = strLookup(bin(Uint8Array.from(buf)));
    if (id !== -1) tokens.push(id);
    else for (const b of buf) tokens.push(b + 3);
    buf = [];
  }
  for (;;) {
    let bestScore = -1e10, bestId = -1, bestIdx = -1;
    for (let i = 0; i < tokens.length - 1; i++) {
      const id = strLookup(vocab[tokens[i]!]! + vocab[tokens[i + 1]!]!);
      if (id !== -1 && data.scores[id]! > bestScore) {
        bestScore = data.scores[id]!;
        bestId = id;
        bestIdx = i;
      }
    }
    if (bestIdx === -1) break;
    tokens.splice(bestIdx, 2, bestId);
  }
  if (eos) tokens.push(2);
  return tokens;
}

const rng = seededRandom;

const WORDS = [
  "Once",
  "upon",
  "a",
  "time",
  "there",
  "was",
  "little",
  "girl",
  "named",
  "Lily",
  "she",
  "loved",
  "to",
  "play",
  "the",
  "park",
  "and",
  "happy",
  "said",
  "Tom",
  "big",
  "dog",
  ".",
  ",",
  "!",
  "?",
  '"',
  "'",
];
const ODD = [
  "é",
  "ñ",
  "ü",
  "ß",
  "“",
  "”",
  "—",
  "…",
  "€",
  "😀",
  "🦙",
  "日本語",
  "你好",
  "Ωμέγα",
  "\n",
  "\t",
  "\r\n",
  "  ",
  "<0x0A>",
  "<s>",
  "</s>",
  "<unk>",
  "\u00a0",
  "\u200a",
  "\u{10FFFF}",
  "\u0301",
];

function randomText(next: () => number, maxParts: number): string {
  const parts: string[] = [];
  const n = Math.floor(next() * maxParts);
  for (let i = 0; i < n; i++) {
    const r = next();
    const pool = r < 0.75 ? WORDS : ODD;
    parts.push(pool[Math.floor(next() * pool.length)]!);
    if (next() < 0.7) parts.push(" ");
  }
  return parts.join("");
}

const utf8Bytes = (s: string) => Array.from(new TextEncoder().encode(s));
const isBytePiece = (tok: Tokenizer, id: number) => /^<0x[0-9A-F]{2}>$/.test(tok.tokenText(id));

Deno.test("Tokenizer.encode() gives the models README's ids for 'Once upon a time' from either vocabulary", () => {
  for (const [name, tok] of both) {
    assertEquals(tok.encode("Once upon a time"), [1, 403, 407, 261, 378], name);
    assertEquals(
      tok.encode("Once upon a time", { bos: false, eos: true }),
      [403, 407, 261, 378, 2],
      name,
    );
    assertEquals([tok.bosId, tok.eosId, tok.vocabSize], [1, 2, 512], name);
  }
  assertEquals(fromLlama2c.encode(""), [1]);
  assertEquals(fromLlama2c.encode("", { bos: false }), []);
});

Deno.test("Tokenizer.encode() equals a literal port of run.c's encode on random text", () => {
  const next = rng(1234);
  for (let i = 0; i < 300; i++) {
    const text = randomText(next, 40);
    const bos = next() < 0.8, eos = next() < 0.3;
    const expected = runcEncode(llama2cData, text, bos, eos);
    for (const [name, tok] of both) {
      assertEquals(tok.encode(text, { bos, eos }), expected, `${name}: ${JSON.stringify(text)}`);
    }
  }
});

Deno.test("Tokenizer.encode() breaks score ties leftmost and ignores pairs below -1e10, as run.c does", () => {
  // A synthetic vocabulary where many merges share a score, so the merge order decides the result.
  const next = rng(99);
  const alphabet = ["a", "b", "c", " "];
  const tokens = ["<unk>", "\n<s>\n", "\n</s>\n"];
  for (let b = 0; b < 256; b++) tokens.push(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
  const seen = new Set(tokens);
  const scores: number[] = tokens.map(() => 0);
  const add = (piece: string) => {
    if (seen.has(piece)) return;
    seen.add(piece);
    tokens.push(piece);
    scores.push(-Math.floor(next() * 3));
  };
  alphabet.forEach(add);
  while (tokens.length < 400) {
    const len = 2 + Math.floor(next() * 4);
    add(Array.from({ length: len }, () => alphabet[Math.floor(next() * alphabet.length)]).join(""));
  }
  const data: TokenizerData = { tokens, scores: Float32Array.from(scores), bosId: 1, eosId: 2 };
  const tok = new Tokenizer(data);
  const textAlphabet = [...alphabet, "x", "é"]; // x and é exercise byte fallback
  for (let i = 0; i < 300; i++) {
    const text = Array.from(
      { length: Math.floor(next() * 60) },
      () => textAlphabet[Math.floor(next() * textAlphabet.length)],
    ).join("");
    assertEquals(tok.encode(text), runcEncode(data, text, true, false), JSON.stringify(text));
  }
  // run.c's search starts at -1e10, so a pair scoring below that never merges.
  const low: TokenizerData = {
    ...data,
    tokens: [...tokens, "x", "y", "xy"],
    scores: Float32Array.from([...scores, -1, -1, -2e10]),
  };
  assertEquals(new Tokenizer(low).encode("xy"), runcEncode(low, "xy", true, false));
  assertEquals(new Tokenizer(low).encode("xy").length, 4);
});

// How fast it is, is bench/tokenizer_bench.ts's to say (an 8,000-character prompt, timed).
Deno.test("Tokenizer.encode() round-trips an 8k-character prompt and still encodes like run.c", () => {
  const next = rng(7);
  let text = "";
  while (text.length < 8192) text += randomText(next, 30) + " ";
  text = text.slice(0, 8192);
  const ids = fromLlama2c.encode(text);
  assertEquals(fromLlama2c.decode(ids), text);
  const slice = text.slice(0, 1500);
  assertEquals(fromLlama2c.encode(slice), runcEncode(llama2cData, slice, true, false));
});

Deno.test("Tokenizer round-trips ASCII, multi-byte UTF-8 and byte-fallback text through decode(encode(x))", () => {
  const texts = [
    "Once upon a time, there was a little girl named Lily.",
    "  leading and trailing spaces  ",
    "Tabs\tand\nnewlines\r\n and ~!@#$%^&*()_+{}|:<>?",
    "Café, naïve, jalapeño, Ångström, façade",
    "Emoji: 😀🦙👩‍👩‍👧 and flags 🇫🇷",
    "CJK: 日本語のテキスト, 中文, 한국어",
    "Bytes only: \u0001\u0002\u007f\u0080\u00ff \u{10FFFF}",
    "Literal specials: <s> </s> <unk> <0x0A>",
    " ",
    "x",
  ];
  for (const [name, tok] of both) {
    for (const text of texts) {
      assertEquals(tok.decode(tok.encode(text)), text, `${name}: ${JSON.stringify(text)}`);
      assertEquals(tok.decode(tok.encode(text, { bos: false }), { afterBos: true }), text, name);
      assertEquals(tok.decode(tok.encode(text, { bos: false })), " " + text, name);
    }
  }
});

Deno.test("Tokenizer.encode() falls back to <0xXX> byte tokens for characters the vocabulary lacks", () => {
  for (const [name, tok] of both) {
    for (const ch of ["😀", "日", "\n", "\u0001"]) {
      const ids = tok.encode(ch, { bos: false });
      // The dummy-prefix space stays a text token; the character becomes its UTF-8 bytes.
      assertEquals(tok.tokenText(ids[0]!), " ", name);
      assertEquals(
        ids.slice(1).map((id) => tok.tokenText(id)),
        utf8Bytes(ch).map((b) => `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`),
        name,
      );
    }
  }
});

Deno.test("IncrementalDecoder emits a character split over byte tokens only when its last byte arrives", () => {
  for (const [name, tok] of both) {
    const emoji = "😀";
    const byteIds = tok.encode(emoji, { bos: false }).slice(1);
    assertEquals(byteIds.length, 4, name);
    assert(byteIds.every((id) => isBytePiece(tok, id)), name);
    const dec = tok.createDecoder();
    assertEquals(byteIds.map((id) => dec.push(id)), ["", "", "", emoji], name);
    assertEquals(dec.flush(), "", name);

    // An incomplete character at the end comes out of flush() as U+FFFD, as TextDecoder would.
    const partial = tok.createDecoder();
    assertEquals(partial.push(byteIds[0]!) + partial.push(byteIds[1]!), "", name);
    assertEquals(partial.flush(), "\uFFFD", name);
  }
});

Deno.test("IncrementalDecoder output concatenated equals decode() for random texts and random id streams", () => {
  const next = rng(42);
  for (const [name, tok] of both) {
    for (let i = 0; i < 200; i++) {
      // Half the streams are encodings of text, half arbitrary ids (broken UTF-8 included).
      const ids = i % 2 === 0
        ? tok.encode(randomText(next, 30))
        : Array.from({ length: Math.floor(next() * 40) }, () => Math.floor(next() * tok.vocabSize));
      const afterBos = next() < 0.5;
      const dec = tok.createDecoder({ afterBos });
      const pieces = ids.map((id) => dec.push(id));
      pieces.push(dec.flush());
      assertEquals(pieces.join(""), tok.decode(ids, { afterBos }), `${name}: ${ids}`);
      for (const p of pieces) {
        assert(!/[\uD800-\uDBFF]$/.test(p), "a push ended inside a surrogate pair");
      }
    }
  }
});

Deno.test("Tokenizer decoding follows run.c: control tokens are empty, a piece after BOS drops one space", () => {
  for (const [name, tok] of both) {
    const once = tok.encode("Once", { bos: false });
    assertEquals(once.length, 1, name);
    const id = once[0]!;
    assertEquals(tok.tokenText(id), " Once", name);
    assertEquals(tok.decode([tok.bosId]), "", name);
    assertEquals(tok.decode([tok.eosId]), "", name);
    assertEquals(tok.decode([id]), " Once", name);
    assertEquals(tok.decode([tok.bosId, id, id]), "Once Once", name);
    assertEquals(tok.decode([id, tok.bosId, id]), " OnceOnce", name);
    assertEquals(tok.decode([tok.eosId, id]), " Once", name);

    const plain = tok.createDecoder();
    assertEquals(plain.push(id), " Once", name);
    const fresh = tok.createDecoder({ afterBos: true });
    assertEquals([fresh.push(id), fresh.push(id)], ["Once", " Once"], name);
    const viaBos = tok.createDecoder();
    assertEquals([viaBos.push(tok.bosId), viaBos.push(id)], ["", "Once"], name);

    // run.c looks at the piece text, so a space spelled as the byte token <0x20> survives.
    const space = tok.decode([tok.bosId, 3 + 0x20]);
    assertEquals(space, " ", name);
  }
});

Deno.test("Tokenizer rejects unknown ids and inconsistent vocabularies with clear messages", () => {
  assertThrows(
    () => fromLlama2c.decode([512]),
    RangeError,
    "Cannot decode token id 512: the vocabulary has ids 0..511",
  );
  assertThrows(() => fromLlama2c.createDecoder().push(-1), RangeError, "token id -1");
  assertThrows(() => fromLlama2c.tokenText(1.5), RangeError, "token id 1.5");
  assertThrows(
    () => new Tokenizer({ ...llama2cData, scores: new Float32Array(3) }),
    Error,
    "Cannot build tokenizer: the vocabulary has 512 tokens but 3 scores",
  );
  assertThrows(
    () => new Tokenizer({ ...llama2cData, eosId: 600 }),
    Error,
    "EOS id must be a token id in 0..511, received 600",
  );
  const badByte = Int32Array.from(ggufData.tokenTypes!);
  badByte[300] = 6;
  assertThrows(
    () => new Tokenizer({ ...ggufData, tokenTypes: badByte }),
    Error,
    "token 300 has type 6 (byte) but its piece",
  );
});

Deno.test("Tokenizer.encode() with special reads control-token text as the token, only when asked", () => {
  // stories260K.gguf marks <s> (1) and </s> (2) as control tokens.
  const tok = fromGguf;
  const text = "Tom ran.</s>Lily sat.";
  const plain = tok.encode(text, { bos: false });
  assert(!plain.includes(tok.eosId), "without special, '</s>' is just characters");
  const special = tok.encode(text, { bos: false, special: true });
  const at = special.indexOf(tok.eosId);
  assert(at > 0, `expected EOS inside ${special}`);
  // The text on each side is encoded on its own, each with the dummy-prefix space: llama.cpp
  // adds it at the start and after every special token (the tinyllama-like chat fixture shows
  // "</s>" followed by "▁").
  assertEquals(special.slice(0, at), tok.encode("Tom ran.", { bos: false }));
  assertEquals(special.slice(at + 1), tok.encode("Lily sat.", { bos: false }));
  assertEquals(
    tok.decode([tok.bosId, ...special]),
    "Tom ran. Lily sat.",
    "control tokens decode to nothing",
  );
  assertEquals(tok.encode("<s>Hi", { bos: false, special: true })[0], tok.bosId);
});
