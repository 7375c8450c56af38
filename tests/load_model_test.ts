import { assert, assertEquals, assertRejects } from "@std/assert";
import { dequantize } from "../lib/model/dequantize.ts";
import { detectModelFormat, loadModel } from "../lib/model/load_model.ts";
import { corruptedCopy, modelFile, tempFile } from "./harness/model_files.ts";

Deno.test("loadModel() tells a GGUF from a llama2.c checkpoint and both give the same model", async () => {
  const gguf = await loadModel(modelFile("stories260K.gguf"));
  const bin = await loadModel(modelFile("stories260K.bin"), {
    tokenizerPath: modelFile("tok512.bin"),
  });
  assertEquals(gguf.source, modelFile("stories260K.gguf"));
  // The files differ only in the context the converter declared and in eps stored as f32.
  assertEquals(
    { ...gguf.config, contextLength: 0, rmsEps: 0 },
    { ...bin.config, contextLength: 0, rmsEps: 0 },
  );
  assertEquals([gguf.config.contextLength, bin.config.contextLength], [128, 512]);
  assertEquals(dequantize(gguf.weights.layers[2]!.wq), dequantize(bin.weights.layers[2]!.wq));
  assertEquals(dequantize(gguf.weights.output), dequantize(bin.weights.output));
  assertEquals(bin.tokenizer?.tokens.length, 512);
  assertEquals(gguf.tokenizer?.tokens.length, 512);
  assertEquals([bin.tokenizer?.bosId, bin.tokenizer?.eosId], [1, 2]);
  assertEquals(bin.tokenizer?.scores, gguf.tokenizer?.scores);
});

Deno.test("loadModel() leaves the tokenizer out of a llama2.c checkpoint given without tokenizer.bin", async () => {
  const bin = await loadModel(modelFile("stories260K.bin"));
  assertEquals(bin.tokenizer, undefined);
});

Deno.test("loadModel() keeps quantized tensors as raw blocks", async () => {
  const m = await loadModel(modelFile("stories260K-q8_0.gguf"));
  assertEquals(m.weights.layers[0]!.wq.type, "q8_0");
  assertEquals(m.weights.layers[0]!.wq.data.byteLength, (64 * 64 / 32) * 34);
  assertEquals(m.weights.layers[0]!.wDown.type, "f16");
});

Deno.test("loadModel() replaces the declared context length when asked", async () => {
  const declared = await loadModel(modelFile("stories260K-ctx512.gguf"));
  const overridden = await loadModel(modelFile("stories260K.gguf"), { contextLength: 512 });
  assertEquals(declared.config.contextLength, 512);
  assertEquals(overridden.config, declared.config);
  const bin = await loadModel(modelFile("stories260K.bin"), { contextLength: 64 });
  assertEquals(bin.config.contextLength, 64);
  await assertRejects(
    () => loadModel(modelFile("stories260K.gguf"), { contextLength: 0 }),
    Error,
    "contextLength must be a positive integer, received 0",
  );
});

Deno.test("detectModelFormat() reads the magic and the llama2.c header", async () => {
  const bin = await Deno.readFile(modelFile("stories260K.bin"));
  const gguf = await Deno.readFile(modelFile("stories260K.gguf"));
  assertEquals(detectModelFormat(gguf.subarray(0, 28)), "gguf");
  assertEquals(detectModelFormat(bin.subarray(0, 28)), "llama2c");
  assertEquals(detectModelFormat(bin.subarray(0, 27)), undefined);
  assertEquals(
    detectModelFormat(new TextEncoder().encode("<!DOCTYPE html><html><head>")),
    undefined,
  );
});

// --- errors, each from a corrupted copy of a shared model file ---

Deno.test("loadModel() rejects a file that is neither format, showing its first bytes", async () => {
  const path = await corruptedCopy(
    "stories260K.gguf",
    (b) => (b.set(new TextEncoder().encode("NOPE")), b),
  );
  await assertRejects(
    () => loadModel(path),
    Error,
    `Cannot load model ${path}: it is neither a GGUF file nor a llama2.c checkpoint: first bytes 4e 4f 50 45 03 00 00 00 ("NOPE....")`,
  );
  // A llama2.c header with a negative dim is no checkpoint either.
  const bin = await corruptedCopy(
    "stories260K.bin",
    (b) => (new DataView(b.buffer).setInt32(0, -64, true), b),
  );
  await assertRejects(
    () => loadModel(bin),
    Error,
    "it is neither a GGUF file nor a llama2.c checkpoint",
  );
  const empty = await tempFile("empty.gguf", new Uint8Array());
  await assertRejects(
    () => loadModel(empty),
    Error,
    "nor a llama2.c checkpoint (only 0 bytes long): first bytes ",
  );
});

Deno.test("loadModel() rejects a truncated GGUF, naming what it was reading and the sizes", async () => {
  const size = (await Deno.stat(modelFile("stories260K.gguf"))).size;
  const half = Math.floor(size / 2);
  const path = await corruptedCopy("stories260K.gguf", (b) => b.slice(0, half));
  const err = await assertRejects(() => loadModel(path), Error);
  assert(
    new RegExp(
      `file is truncated while reading the data of tensor 'blk\\.\\d\\.\\w+\\.weight': needs \\d+ bytes, received ${half}$`,
    )
      .test(err.message),
    err.message,
  );
});

Deno.test("loadModel() rejects a truncated llama2.c checkpoint", async () => {
  const path = await corruptedCopy("stories260K.bin", (b) => b.slice(0, 100_000));
  await assertRejects(() => loadModel(path), Error, "is truncated at tensor");
});

Deno.test("loadModel() rejects an unsupported GGUF version", async () => {
  const path = await corruptedCopy(
    "stories260K.gguf",
    (b) => (new DataView(b.buffer).setUint32(4, 7, true), b),
  );
  await assertRejects(
    () => loadModel(path),
    Error,
    `Cannot load GGUF ${path}: unsupported GGUF version 7; supported: 2, 3`,
  );
});

Deno.test("loadModel() reports reading progress up to the weights' size", async () => {
  for (const name of ["stories260K.gguf", "stories260K.bin"]) {
    const seen: Array<[number, number]> = [];
    const opts = name.endsWith(".bin") ? { tokenizerPath: modelFile("tok512.bin") } : {};
    await loadModel(modelFile(name), {
      ...opts,
      onProgress: (read, total) => seen.push([read, total]),
    });
    const size = (await Deno.stat(modelFile(name))).size;
    const [read, total] = seen.at(-1)!;
    assertEquals(read, total, `${name}: progress should end complete`);
    // A GGUF reports its data section (the file minus its header), a .bin the whole file.
    assert(total <= size && total > size * 0.5, `${name}: total ${total} vs file size ${size}`);
  }
});
