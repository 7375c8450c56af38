/**
 * The tokenizer against llama.cpp's llama_tokenize on 164 seeded random prompts (contractions in
 * any case, digit runs, every kind of whitespace, punctuation, many scripts, emoji, a combining
 * accent, special-token spellings, long runs) for the Llama 3, Qwen2.5 and TinyLlama
 * vocabularies, and Llama 3's vocabulary under the gpt-2, smollm and default pre-tokenizers;
 * and 80 template-like texts with special-token spellings, read as template text
 * (parse_special), where llama.cpp and we both make them tokens; and the printed bytes of every
 * token of four vocabularies (a SHA-256 of llama.cpp's token_to_piece stream).
 * The ids were written by llama.cpp (tests/fixtures/llama_cpp_tokenize/README.md says how).
 */
import { assertEquals } from "@std/assert";
import { readGgufTokenizer } from "../lib/model/gguf_tokenizer.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { modelFile } from "./harness/model_files.ts";

const fixture = JSON.parse(
  await Deno.readTextFile(
    new URL("./fixtures/llama_cpp_tokenize/random_prompts.json", import.meta.url),
  ),
) as { prompts: string[]; ids: Record<string, number[][]> };

for (const [name, want] of Object.entries(fixture.ids)) {
  Deno.test(`${name}: ${fixture.prompts.length} random prompts encode to llama.cpp's ids`, async () => {
    // "file pre=X": the file's vocabulary with tokenizer.ggml.pre = X, as the fixture's copy has it.
    const [file, pre] = name.split(" pre=");
    const data = (await readGgufTokenizer(modelFile(`compat/${file}`)))!;
    const tok = new Tokenizer(pre === undefined ? data : { ...data, pre });
    assertEquals(want.length, fixture.prompts.length);
    const diffs = fixture.prompts.flatMap((p, i) => {
      const got = tok.encode(p);
      return JSON.stringify(got) === JSON.stringify(want[i]) ? [] : [
        `${JSON.stringify(p)}: got ${JSON.stringify(got)}, llama.cpp ${JSON.stringify(want[i])}`,
      ];
    });
    assertEquals(diffs, [], `${diffs.length} of ${fixture.prompts.length} prompts differ`);
  });
}

const template = JSON.parse(
  await Deno.readTextFile(
    new URL("./fixtures/llama_cpp_tokenize/template_text.json", import.meta.url),
  ),
) as { prompts: string[]; ids: Record<string, number[][]> };

for (const [file, want] of Object.entries(template.ids)) {
  Deno.test(`${file}: ${template.prompts.length} template-like texts with special tokens parse as llama.cpp's`, async () => {
    const tok = new Tokenizer((await readGgufTokenizer(modelFile(`compat/${file}`)))!);
    const diffs = template.prompts.flatMap((p, i) => {
      const got = tok.encode(p, { special: true });
      return JSON.stringify(got) === JSON.stringify(want[i]) ? [] : [
        `${JSON.stringify(p)}: got ${JSON.stringify(got)}, llama.cpp ${JSON.stringify(want[i])}`,
      ];
    });
    assertEquals(diffs, [], `${diffs.length} of ${template.prompts.length} texts differ`);
  });
}

const pieces = JSON.parse(
  await Deno.readTextFile(
    new URL("./fixtures/llama_cpp_tokenize/pieces_sha256.json", import.meta.url),
  ),
) as { sha256: Record<string, string> };

for (const [file, sha256] of Object.entries(pieces.sha256)) {
  Deno.test(`${file}: every token prints the bytes llama.cpp's token_to_piece gives`, async () => {
    const tok = new Tokenizer((await readGgufTokenizer(modelFile(`compat/${file}`)))!);
    const parts: Uint8Array[] = [];
    for (let id = 0; id < tok.vocabSize; id++) {
      const bytes = tok.tokenBytes(id);
      const len = new Uint8Array(4);
      new DataView(len.buffer).setUint32(0, bytes.length, true);
      parts.push(len, bytes);
    }
    const stream = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    parts.reduce((at, p) => (stream.set(p, at), at + p.length), 0);
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", stream));
    const hex = Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
    assertEquals(hex, sha256, `the pieces of all ${tok.vocabSize} tokens`);
  });
}
