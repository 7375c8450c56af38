/**
 * Weights holding a NaN or an infinity are refused at load, naming the tensor and where: they
 * would load and then give NaN logits for every token. Real files (stories260K in f32, the
 * tinyllama-like Q4_0 and a Q4_K_M file) with one value overwritten; the untouched files load.
 */
import { assert, assertEquals, assertRejects } from "@std/assert";
import { loadModel } from "../lib/model/load_model.ts";
import { parseGgufHeader } from "../lib/model/gguf.ts";
import { firstNonFinite } from "../lib/model/finite_weights.ts";
import { modelFile, tempFile } from "./harness/model_files.ts";

/** A copy of `name` with `value` written at byte `at` of tensor `tensor`'s data. */
async function withBytesAt(
  name: string,
  tensor: string,
  at: number,
  value: Uint8Array,
): Promise<string> {
  const b = await Deno.readFile(modelFile(name));
  const h = parseGgufHeader(b, name);
  const info = h.tensorInfos.find((t) => t.name === tensor)!;
  b.set(value, h.dataOffset + info.offset + at);
  return await tempFile(name.split("/").pop()!, b);
}

const f32 = (x: number) => new Uint8Array(new Float32Array([x]).buffer);
const u16 = (x: number) => new Uint8Array(new Uint16Array([x]).buffer);

Deno.test("a NaN in an f32 norm weight is refused, naming the tensor and the element", async () => {
  const path = await withBytesAt("stories260K.gguf", "blk.2.ffn_norm.weight", 4 * 17, f32(NaN));
  await assertRejects(
    () => loadModel(path),
    Error,
    `Cannot load model ${path}: tensor 'blk.2.ffn_norm.weight' (f32) holds NaN at element 17: the file is corrupt`,
  );
});

Deno.test("an infinite f16 block scale in a Q4_0 matrix is refused, naming the block", async () => {
  // Block 5 of 18 bytes; its scale is the block's first two bytes; 0xfc00 is -Infinity.
  const path = await withBytesAt(
    "compat/tinyllama-like-q4_0.gguf",
    "blk.0.attn_q.weight",
    18 * 5,
    u16(0xfc00),
  );
  await assertRejects(
    () => loadModel(path),
    Error,
    "tensor 'blk.0.attn_q.weight' (q4_0) holds -Infinity at the scale of block 5: the file is corrupt",
  );
});

Deno.test("a NaN minimum (dmin) in a Q4_K block is refused", async () => {
  const file = "compat/llama3-like-q4_k_m.gguf";
  const bytes = await Deno.readFile(modelFile(file));
  const h = parseGgufHeader(bytes, file);
  // The first Q4_K (type 12) tensor; its blocks are 144 bytes, dmin at byte 2.
  const info = h.tensorInfos.find((t) => t.typeId === 12)!;
  const path = await withBytesAt(file, info.name, 144 * 3 + 2, u16(0x7e00));
  const err = await assertRejects(() => loadModel(path), Error);
  assert(
    err.message.endsWith(
      `tensor '${info.name}' (q4_k) holds NaN at the scale of block 3: the file is corrupt`,
    ),
    err.message,
  );
});

Deno.test("the untouched files hold no NaN or infinity", async () => {
  for (
    const f of [
      "stories260K.gguf",
      "compat/tinyllama-like-q4_0.gguf",
      "compat/llama3-like-q4_k_m.gguf",
      "compat/stories260K-bf16.gguf",
    ]
  ) {
    const m = await loadModel(modelFile(f));
    for (
      const t of [
        m.weights.tokenEmbedding,
        m.weights.output,
        ...m.weights.layers.map((l) => l.wq),
      ]
    ) {
      assertEquals(firstNonFinite(t), undefined, `${f}: ${t.name}`);
    }
  }
});

Deno.test("firstNonFinite() finds an infinity in bf16 and f16 values by their exponent bits", () => {
  const bf16 = new Uint16Array([0x3f80, 0x7f80, 0]); // 1, +Infinity
  assertEquals(
    firstNonFinite({ name: "b", type: "bf16", shape: [3], data: new Uint8Array(bf16.buffer) }),
    { element: "element 1", value: Infinity },
  );
  const f16 = new Uint16Array([0x3c00, 0x7bff, 0x7c01]); // 1, 65504 (finite), NaN
  assertEquals(
    firstNonFinite({ name: "h", type: "f16", shape: [3], data: new Uint8Array(f16.buffer) }),
    { element: "element 2", value: NaN },
  );
});
