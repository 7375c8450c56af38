import { assertEquals } from "@std/assert";
import { MODEL_FILE, modelStem } from "../lib/source/model_source.ts";

Deno.test("MODEL_FILE and modelStem(): .gguf and .bin in any case, the name without its folder and ending", () => {
  for (const name of ["a.gguf", "b.bin", "C.GGUF", "d.Bin"]) {
    assertEquals(MODEL_FILE.test(name), true, name);
  }
  for (const name of ["a.gguf.part", "a.url", "gguf", "a.ggufx"]) {
    assertEquals(MODEL_FILE.test(name), false, name);
  }
  assertEquals(modelStem("/models/stories260K-q8_0.gguf"), "stories260K-q8_0");
  assertEquals(modelStem("Llama.GGUF"), "Llama");
  assertEquals(modelStem("dir/tok512.bin"), "tok512");
  assertEquals(modelStem("dir/model.gguf.part"), "model.gguf.part");
});
