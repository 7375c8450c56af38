/** The one GGUF header reader (readGgufHeaderOf, under readGguf, readGgufHeader and describeModelFile) and describeGgufValue. */
import { assertEquals, assertRejects } from "@std/assert";
import {
  describeGgufValue,
  GgufTruncatedError,
  readGgufHeader,
  readGgufHeaderOf,
} from "../lib/model/gguf.ts";
import { describeModelFile } from "../lib/model/model_info.ts";
import { f32Bytes, T, writeGguf } from "./_gguf_writer.ts";
import { tempFile } from "./harness/model_files.ts";

Deno.test("readGgufHeaderOf(): a header of 9 MiB, past two growths of the first 1 MiB read, parses whole", async () => {
  const big = "y".repeat(9 << 20);
  const bytes = writeGguf({
    metadata: [
      { key: "general.architecture", type: T.STRING, value: "llama" },
      { key: "big", type: T.STRING, value: big },
      { key: "llama.context_length", type: T.U32, value: 96 },
    ],
    tensors: [{ name: "w", dims: [2], typeId: 0, data: f32Bytes([1, 2]) }],
  });
  const path = await tempFile("huge_header.gguf", bytes);
  using file = await Deno.open(path);
  const h = await readGgufHeaderOf(file, bytes.length, path);
  assertEquals(h.metadata.get("big")?.value, big);
  assertEquals(h.tensorInfos.map((t) => t.name), ["w"]);
  // Its other callers read the same header.
  assertEquals((await readGgufHeader(path)).metadata.get("llama.context_length")?.value, 96);
  const info = await describeModelFile(path);
  assertEquals([info.format, info.architecture, info.contextLength], ["gguf", "llama", 96]);
});

Deno.test("readGgufHeaderOf(): a file cut inside its header is refused as truncated, not retried forever", async () => {
  const bytes = writeGguf({
    metadata: [{ key: "big", type: T.STRING, value: "z".repeat(2 << 20) }],
  });
  const cut = bytes.subarray(0, 1_500_000);
  const path = await tempFile("cut_header.gguf", cut);
  using file = await Deno.open(path);
  await assertRejects(() => readGgufHeaderOf(file, cut.length, path), GgufTruncatedError);
});

Deno.test("describeGgufValue(): each kind of metadata value in a few words", () => {
  assertEquals(describeGgufValue(undefined), "nothing");
  assertEquals(describeGgufValue("llama"), "'llama'");
  assertEquals(describeGgufValue(["a", "b", "c"]), "an array of 3");
  assertEquals(describeGgufValue(new Float32Array(4)), "a Float32Array of 4");
  assertEquals(describeGgufValue(7), "number 7");
  assertEquals(describeGgufValue(true), "boolean true");
});
