/**
 * Corrupt GGUFs are refused with an error that names the file, never a runtime error with no
 * context (a RangeError from an allocation, a stack overflow), and never a hang: real files
 * truncated at many points, and their headers overwritten 8 bytes at a time at seeded random
 * places with patterns a broken copy or a hostile file holds (all ones, huge counts, zeros,
 * random bytes).
 */
import { assert } from "@std/assert";
import { loadModel } from "../lib/model/load_model.ts";
import { parseGgufHeader } from "../lib/model/gguf.ts";
import { modelFile, tempFile } from "./harness/model_files.ts";
import { rng } from "./_gpu.ts";

const PATTERNS: ((r: () => number) => number[])[] = [
  () => [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
  () => [0, 0, 0, 0, 0, 0x01, 0, 0], // 2^40
  () => [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0], // 2^53 - 1
  () => [0, 0, 0, 0x40, 0, 0, 0, 0], // 2^30
  () => [0, 0, 0, 0, 0, 0, 0, 0],
  (r) => Array.from({ length: 8 }, () => Math.floor(r() * 256)),
];

async function outcome(path: string): Promise<string | undefined> {
  try {
    await loadModel(path);
    return undefined;
  } catch (e) {
    return e instanceof Error ? `${e.name}: ${e.message}` : `thrown non-error: ${String(e)}`;
  }
}

// Ours (Error, GgufTruncatedError), never the runtime's: those name no file.
const RUNTIME_ERRORS = /^(RangeError|TypeError|SyntaxError|InternalError|ReferenceError)\b/;

// The qwen2-like file's 152k-token vocabulary makes each load ~0.2 s: fewer cases there.
for (
  const [name, overwrites] of [["stories260K.gguf", 120], [
    "compat/qwen2-like-q4_k_m.gguf",
    12,
  ]] as const
) {
  Deno.test(`corrupt copies of ${name}: each loads or is refused naming the file`, async () => {
    const original = await Deno.readFile(modelFile(name));
    const headerEnd = parseGgufHeader(original, name).dataOffset;
    const rand = rng(name.length);
    const cases: { what: string; bytes: Uint8Array }[] = [];
    for (let i = 1; i <= 20; i++) {
      const at = Math.floor((i / 21) * (i <= 15 ? headerEnd : original.length));
      cases.push({ what: `truncated at ${at}`, bytes: original.slice(0, at) });
    }
    // Aimed: every array's count, and every tensor's first dimension, set huge (where a
    // reader allocates by what the header says).
    const header = parseGgufHeader(original, name);
    const find = (text: string) => {
      const needle = new TextEncoder().encode(text);
      outer: for (let i = 0; i + needle.length <= headerEnd; i++) {
        for (let k = 0; k < needle.length; k++) if (original[i + k] !== needle[k]) continue outer;
        return i + needle.length;
      }
      throw new Error(`${text} not found in ${name}'s header`);
    };
    const aimed: { what: string; at: number }[] = [];
    for (const [key, entry] of header.metadata) {
      if (entry.type === 9) aimed.push({ what: `the count of ${key}`, at: find(key) + 8 });
    }
    for (const t of header.tensorInfos.slice(0, 3)) {
      aimed.push({ what: `dimension 0 of ${t.name}`, at: find(t.name) + 4 });
    }
    for (const { what, at } of aimed) {
      for (const p of PATTERNS.slice(0, 3)) {
        const bytes = original.slice();
        bytes.set(p(rand), at);
        cases.push({ what: `${what} = ${p(rand).map((b) => b.toString(16)).join(" ")}`, bytes });
      }
    }
    for (let i = 0; i < overwrites; i++) {
      const at = 8 + Math.floor(rand() * (headerEnd - 16));
      const p = PATTERNS[i % PATTERNS.length]!(rand);
      const bytes = original.slice();
      bytes.set(p, at);
      cases.push({ what: `8 bytes at ${at} = ${p.map((b) => b.toString(16)).join(" ")}`, bytes });
    }
    let refused = 0;
    for (const c of cases) {
      const path = await tempFile(name.split("/").pop()!, c.bytes);
      try {
        const got = await outcome(path);
        if (got === undefined) continue;
        refused++;
        assert(
          !RUNTIME_ERRORS.test(got) && /^\w+: Cannot load /.test(got) && got.includes(path),
          `${c.what}: ${got}`,
        );
      } finally {
        await Deno.remove(path);
      }
    }
    assert(refused >= 20, `only ${refused} of ${cases.length} corruptions were refused`);
    console.log(
      `${name}: ${cases.length} corrupt copies, ${refused} refused naming the file, ${
        cases.length - refused
      } loaded`,
    );
  });
}
