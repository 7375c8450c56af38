import { assertEquals, assertThrows } from "@std/assert";
import { parseLlama2cTokenizer } from "../lib/tokenizer/llama2c_tokenizer.ts";
import { readGguf } from "../lib/model/gguf.ts";
import { ggufToModel } from "../lib/model/gguf_model.ts";

function modelsMirror(): string {
  const dir = Deno.env.get("MODEL_MIRROR");
  if (!dir) {
    throw new Error(
      "MODEL_MIRROR is unset: point it at the test models directory (e.g. ../shared/models)",
    );
  }
  return dir;
}

const tok512Path = () => `${modelsMirror()}/tok512.bin`;

/** Byte offsets where each token record starts, found by a plain walk of the format. */
function recordOffsets(bytes: Uint8Array, count: number): number[] {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const offsets: number[] = [];
  let o = 4;
  for (let i = 0; i < count; i++) {
    offsets.push(o);
    o += 8 + view.getInt32(o + 4, true);
  }
  offsets.push(o);
  return offsets;
}

Deno.test("parseLlama2cTokenizer() reads tok512.bin as llama.cpp's converter read it into stories260K.gguf", async () => {
  const bytes = await Deno.readFile(tok512Path());
  const tok = parseLlama2cTokenizer(bytes, 512, "tok512.bin");
  const gguf = ggufToModel(await readGguf(`${modelsMirror()}/stories260K.gguf`), "stories260K.gguf")
    .tokenizer!;
  assertEquals(tok.tokens.length, 512);
  assertEquals(tok.scores.length, 512);
  assertEquals(gguf.tokens.length, 512);
  // The converter renames the three specials and spells spaces "▁"; everything else must agree.
  assertEquals(tok.tokens.slice(0, 3), ["<unk>", "\n<s>\n", "\n</s>\n"]);
  assertEquals(gguf.tokens.slice(0, 3), ["<unk>", "<s>", "</s>"]);
  assertEquals(tok.tokens.slice(3), gguf.tokens.slice(3).map((t) => t.replaceAll("\u2581", " ")));
  assertEquals(Array.from(tok.scores), Array.from(gguf.scores));
  assertEquals([tok.bosId, tok.eosId], [gguf.bosId, gguf.eosId]);
  assertEquals(tok.tokenTypes, undefined);
});

Deno.test("parseLlama2cTokenizer() loses nothing: writing its result back gives the file's bytes", async () => {
  const bytes = await Deno.readFile(tok512Path());
  const tok = parseLlama2cTokenizer(bytes, 512, "tok512.bin");
  const enc = new TextEncoder();
  const parts: Uint8Array[] = [bytes.subarray(0, 4)];
  tok.tokens.forEach((t, i) => {
    const text = enc.encode(t);
    const head = new DataView(new ArrayBuffer(8));
    head.setFloat32(0, tok.scores[i]!, true);
    head.setInt32(4, text.byteLength, true);
    parts.push(new Uint8Array(head.buffer), text);
  });
  const rebuilt = new Uint8Array(parts.reduce((n, p) => n + p.byteLength, 0));
  let o = 0;
  for (const p of parts) {
    rebuilt.set(p, o);
    o += p.byteLength;
  }
  assertEquals(rebuilt, bytes);
});

Deno.test("parseLlama2cTokenizer() names the token where a truncated file ends", async () => {
  const bytes = await Deno.readFile(tok512Path());
  const offsets = recordOffsets(bytes, 512);
  const cases: [cut: number, token: number][] = [
    [offsets[100]! + 3, 100], // inside token 100's score
    [offsets[100]! + 9, 100], // inside token 100's text
    [offsets[511]!, 511], // token 511 missing entirely
    [bytes.byteLength - 1, 511], // last byte of the last token missing
  ];
  for (const [cut, token] of cases) {
    const err = assertThrows(
      () => parseLlama2cTokenizer(bytes.slice(0, cut), 512, "cut.bin"),
      Error,
    );
    assertEquals(
      err.message.startsWith(
        `Cannot load llama2.c tokenizer cut.bin: file is truncated at token ${token} of 512`,
      ),
      true,
      `cut at ${cut}: ${err.message}`,
    );
  }
  const err = assertThrows(() => parseLlama2cTokenizer(bytes, 513, "tok512.bin"), Error);
  assertEquals(err.message.includes("truncated at token 512 of 513"), true, err.message);
  const header = assertThrows(
    () => parseLlama2cTokenizer(bytes.slice(0, 2), 512, "tiny.bin"),
    Error,
  );
  assertEquals(
    header.message.includes("expected a 4-byte max_token_length header, received 2 bytes"),
    true,
    header.message,
  );
});

Deno.test("parseLlama2cTokenizer() rejects a negative token length, a bad header and a bad vocabulary size", async () => {
  const bytes = await Deno.readFile(tok512Path());
  const offsets = recordOffsets(bytes, 512);
  const negative = bytes.slice();
  new DataView(negative.buffer).setInt32(offsets[5]! + 4, -3, true);
  assertThrows(
    () => parseLlama2cTokenizer(negative, 512, "neg.bin"),
    Error,
    "token 5 has a negative length -3",
  );

  const zeroMax = bytes.slice();
  new DataView(zeroMax.buffer).setInt32(0, 0, true);
  assertThrows(
    () => parseLlama2cTokenizer(zeroMax, 512, "zero.bin"),
    Error,
    "max_token_length must be positive, received 0",
  );

  assertThrows(
    () => parseLlama2cTokenizer(bytes, 0, "tok512.bin"),
    Error,
    "vocabulary size must be an integer above 2, received 0",
  );
});
