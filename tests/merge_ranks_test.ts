import { assertEquals, assertThrows } from "@std/assert";
import { MergeRanks } from "../lib/tokenizer/merge_ranks.ts";
import { ByteStrings } from "../lib/util/byte_strings.ts";
import { readGgufHeader } from "../lib/model/gguf.ts";
import { modelFile } from "./harness/model_files.ts";

Deno.test("MergeRanks gives each pair its index, the first of duplicates, and -1 for no merge", () => {
  const r = new MergeRanks(["Ġ t", "h e", "Ġ t", "日 本", "🦙 x"]);
  assertEquals(r.rank("Ġ", "t"), 0);
  assertEquals(r.rank("h", "e"), 1);
  assertEquals(r.rank("日", "本"), 3);
  assertEquals(r.rank("🦙", "x"), 4);
  assertEquals([r.rank("t", "Ġ"), r.rank("Ġt", ""), r.rank("", "Ġt"), r.rank("h", "")], [
    -1,
    -1,
    -1,
    -1,
  ]);
  assertEquals(r.size, 4, "the duplicate takes no slot");
});

Deno.test("MergeRanks from bytes equals MergeRanks from strings on a real vocabulary's merges", async () => {
  const header = await readGgufHeader(modelFile("compat/qwen2-like-q4_k_m.gguf"));
  const merges = header.metadata.get("tokenizer.ggml.merges")!.value as ByteStrings;
  assertEquals(merges instanceof ByteStrings, true, "GGUF merges stay bytes");
  const strings = Array.from({ length: merges.length }, (_, i) => merges.get(i));
  const fromBytes = new MergeRanks(merges);
  const fromStrings = new MergeRanks(strings);
  for (let i = 0; i < strings.length; i += 97) {
    const [a, b] = [
      strings[i]!.slice(0, strings[i]!.indexOf(" ", 1)),
      strings[i]!.slice(strings[i]!.indexOf(" ", 1) + 1),
    ];
    assertEquals([fromBytes.rank(a, b), fromStrings.rank(a, b)], [i, i], strings[i]);
  }
  assertEquals(strings[0], "Ġ Ġ", "Qwen2.5's first merge, as its merges.txt lists it");
});

Deno.test("ByteStrings checks its offsets", () => {
  assertEquals(ByteStrings.from(["a", "é", ""]).get(1), "é");
  assertThrows(
    () => new ByteStrings(new Uint8Array(3), Uint32Array.of(0, 2)),
    RangeError,
    "last offset",
  );
});
