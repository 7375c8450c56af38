import { assert, assertEquals } from "@std/assert";
import { dequantize, f16ToF32, f32ToF16 } from "../lib/model/dequantize.ts";
import { readGguf } from "../lib/model/gguf.ts";
import type { Tensor } from "../lib/model/tensor.ts";
import { modelFile } from "./_model_files.ts";

const tensor = (type: Tensor["type"], shape: number[], bytes: number[]): Tensor => ({
  name: "t",
  type,
  shape,
  data: new Uint8Array(bytes),
});

Deno.test("dequantize() expands hand-made Q4_0 blocks", () => {
  // Block 0: scale 0.5 (f16 0x3800); byte j holds element j in its low nibble and element j+16 in its high one.
  // Low nibbles 0..15, high nibbles 15..0, so element j = (j - 8) * 0.5 and element j+16 = (7 - j) * 0.5.
  const block0 = [0x00, 0x38, ...Array.from({ length: 16 }, (_, j) => ((15 - j) << 4) | j)];
  // Block 1: scale -2 (0xc000); every byte 0x08: low nibble 8 -> 0, high nibble 0 -> (0 - 8) * -2 = 16.
  const block1 = [0x00, 0xc0, ...new Array(16).fill(0x08)];
  const out = dequantize(tensor("q4_0", [2, 32], [...block0, ...block1]));
  assertEquals(Array.from(out.subarray(0, 32)), [
    -4,
    -3.5,
    -3,
    -2.5,
    -2,
    -1.5,
    -1,
    -0.5,
    0,
    0.5,
    1,
    1.5,
    2,
    2.5,
    3,
    3.5,
    3.5,
    3,
    2.5,
    2,
    1.5,
    1,
    0.5,
    0,
    -0.5,
    -1,
    -1.5,
    -2,
    -2.5,
    -3,
    -3.5,
    -4,
  ]);
  assertEquals(Array.from(out.subarray(32, 48)), new Array(16).fill(0));
  assertEquals(Array.from(out.subarray(48, 64)), new Array(16).fill(16));
});

Deno.test("dequantize() expands a hand-made Q8_0 block", () => {
  // Scale 0.25 (f16 0x3400), quants -128, -1, 0, 1, 127, then 27 copies of 4.
  const q = [-128, -1, 0, 1, 127, ...new Array(27).fill(4)].map((v) => v & 0xff);
  const out = dequantize(tensor("q8_0", [32], [0x00, 0x34, ...q]));
  assertEquals(Array.from(out), [-32, -0.25, 0, 0.25, 31.75, ...new Array(27).fill(1)]);
});

Deno.test("dequantize() reads F16 and F32 values, including the f16 edge cases", () => {
  const f16 = [0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x7c00, 0x3555];
  const out = dequantize(tensor("f16", [f16.length], f16.flatMap((b) => [b & 0xff, b >> 8])));
  assertEquals(Array.from(out), [1, -2, 65504, 2 ** -24, -0, Infinity, 0.333251953125]);
  assertEquals(f16.map((b) => f32ToF16(f16ToF32(b))), f16);
  const f32 = dequantize(tensor("f32", [2], [0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc1]));
  assertEquals(Array.from(f32), [1, -10]);
});

Deno.test("the Q8_0 GGUF's dequantized weights match the F32 GGUF's within the format's error", async () => {
  const f32 = await readGguf(modelFile("stories260K.gguf"));
  const q8 = await readGguf(modelFile("stories260K-q8_0.gguf"));
  assertEquals([...q8.tensors.keys()].sort(), [...f32.tensors.keys()].sort());
  const counts = { q8_0: 0, f16: 0, f32: 0, q4_0: 0 };
  for (const [name, q] of q8.tensors) {
    counts[q.type]++;
    const ref = f32.tensors.get(name)!;
    assertEquals(q.shape, ref.shape, name);
    const x = dequantize(ref);
    const y = dequantize(q);
    if (q.type === "f32") {
      assertEquals(y, x, name);
    } else if (q.type === "f16") {
      // Round to nearest f16: relative error 2^-11 for normal values, absolute 2^-25 below them.
      for (let i = 0; i < x.length; i++) {
        const bound = Math.max(Math.abs(x[i]!) * 2 ** -11, 2 ** -25);
        assert(Math.abs(y[i]! - x[i]!) <= bound, `${name}[${i}]: ${y[i]} vs ${x[i]}`);
      }
    } else {
      assertEquals(q.type, "q8_0", name);
      // llama.cpp: d = amax/127, q = round(x/d), stored scale d16 = f16(d). So
      // |x - d16*q| <= |x - d*q| + |q|*|d - d16| <= d/2 + 127*|d - d16|. (d16/2 alone is
      // exceeded by up to ~9% here, because the stored scale is rounded to f16.)
      const view = new DataView(q.data.buffer, q.data.byteOffset, q.data.byteLength);
      for (let b = 0; b < x.length / 32; b++) {
        const block = x.subarray(b * 32, b * 32 + 32);
        const d = Math.fround(Math.max(...block.map(Math.abs)) / 127);
        const d16 = f16ToF32(view.getUint16(b * 34, true));
        assertEquals(d16, f16ToF32(f32ToF16(d)), `${name} block ${b} scale`);
        const bound = d / 2 + 127 * Math.abs(d - d16) + 1e-7 * d;
        for (let j = 0; j < 32; j++) {
          const err = Math.abs(y[b * 32 + j]! - block[j]!);
          assert(
            err <= bound,
            `${name}[${b * 32 + j}]: |${y[b * 32 + j]} - ${block[j]}| > ${bound}`,
          );
        }
      }
    }
  }
  // The README's description of the file: ffn_down fell back to F16, norms stayed F32, the rest is Q8_0.
  assertEquals(counts, { q8_0: 2 + 6 * 5, f16: 5, f32: 1 + 2 * 5, q4_0: 0 });
});
