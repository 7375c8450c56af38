import { assert, assertEquals } from "@std/assert";
import { dequantize, f16ToF32, f32ToF16 } from "../lib/model/dequantize.ts";
import { readGguf } from "../lib/model/gguf.ts";
import type { Tensor } from "../lib/model/tensor.ts";
import { modelFile } from "./harness/model_files.ts";

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
  const counts: Record<string, number> = { q8_0: 0, f16: 0, f32: 0, q4_0: 0 };
  for (const [name, q] of q8.tensors) {
    counts[q.type] = (counts[q.type] ?? 0) + 1;
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

// ---- The types added for real-world files. Each block's bytes are written out here, and the
// expected values follow ggml's reference dequantization (ggml-quants.c), written in its own
// loop order rather than by the per-element index arithmetic lib/model/dequantize.ts uses.

const le16 = (v: number) => [v & 0xff, v >> 8];

Deno.test("dequantize() reads BF16 as the top half of an f32", () => {
  // 0x3f80 -> 1, 0xc020 -> -2.5, 0x4049 -> 1.5703125 * 2 = 3.140625, 0x7f80 -> +inf,
  // 0x0001 -> the smallest subnormal 2^-133, 0x8000 -> -0.
  const bits = [0x3f80, 0xc020, 0x4049, 0x7f80, 0x0001, 0x8000];
  const out = dequantize(tensor("bf16", [bits.length], bits.flatMap(le16)));
  assertEquals(Array.from(out), [1, -2.5, 3.140625, Infinity, 2 ** -133, -0]);
});

Deno.test("dequantize() expands a hand-made Q4_1 block: d * q + m", () => {
  // d = 0.5 (f16 0x3800), m = -1 (0xbc00); byte j: low nibble j (element j), high nibble
  // 15 - j (element j + 16).
  const qs = Array.from({ length: 16 }, (_, j) => ((15 - j) << 4) | j);
  const out = dequantize(tensor("q4_1", [32], [...le16(0x3800), ...le16(0xbc00), ...qs]));
  const want = [
    ...Array.from({ length: 16 }, (_, j) => 0.5 * j - 1),
    ...Array.from({ length: 16 }, (_, j) => 0.5 * (15 - j) - 1),
  ];
  assertEquals(Array.from(out), want);
  assertEquals([out[0], out[15], out[16], out[31]], [-1, 6.5, 6.5, -1]);
});

Deno.test("dequantize() expands a hand-made Q5_0 block: d * (q - 16), fifth bit from qh", () => {
  // d = 0.25 (0x3400); qh = 0x0f0f00ff: bit i is element i's fifth bit, so elements 0..7,
  // 16..19 and 24..27 have it. Byte j: low nibble j (element j), high nibble 15 - j (j + 16).
  const qs = Array.from({ length: 16 }, (_, j) => ((15 - j) << 4) | j);
  const out = dequantize(
    tensor("q5_0", [32], [...le16(0x3400), 0xff, 0x00, 0x0f, 0x0f, ...qs]),
  );
  const high = (i: number) => (i < 8 || (i >= 16 && i < 20) || (i >= 24 && i < 28) ? 16 : 0);
  const want = [
    ...Array.from({ length: 16 }, (_, j) => 0.25 * (j + high(j) - 16)),
    ...Array.from({ length: 16 }, (_, j) => 0.25 * (15 - j + high(j + 16) - 16)),
  ];
  assertEquals(Array.from(out), want);
  // element 0: 0 + 16 - 16 = 0; element 8: 8 - 16 -> -2; element 16: 15 + 16 - 16 -> 3.75.
  assertEquals([out[0], out[8], out[16], out[31]], [0, -2, 3.75, -4]);
});

Deno.test("dequantize() expands a hand-made Q5_1 block: d * q + m, fifth bit from qh", () => {
  // d = 0.5, m = 0.125 (0x3000), qh = 0xffff0000 (elements 16..31 get +16), byte j = j * 0x11.
  const qs = Array.from({ length: 16 }, (_, j) => j * 0x11);
  const out = dequantize(
    tensor("q5_1", [32], [...le16(0x3800), ...le16(0x3000), 0, 0, 0xff, 0xff, ...qs]),
  );
  assertEquals(Array.from(out), Array.from({ length: 32 }, (_, i) => 0.5 * i + 0.125));
});

/** Q2_K/Q3_K quants: every byte of the first 32 is 0xe4 (2-bit fields 0,1,2,3), of the next 32 0x1b (3,2,1,0). */
const twoBitQs = [...new Array(32).fill(0xe4), ...new Array(32).fill(0x1b)];

Deno.test("dequantize() expands a hand-made Q2_K block: d * scale * q - dmin * min per 16 elements", () => {
  // scales[i] = min i%4 (high nibble) | scale 15 - i (low nibble); d = 1 (0x3c00), dmin = 0.5.
  const scales = Array.from({ length: 16 }, (_, i) => ((i % 4) << 4) | (15 - i));
  const bytes = [...scales, ...twoBitQs, ...le16(0x3c00), ...le16(0x3800)];
  assertEquals(bytes.length, 84);
  const out = dequantize(tensor("q2_k", [256], bytes));
  // ggml: for each 128-element half n, for shift j = 0..3: 16 elements from qs[32n + l] with
  // scales[is], 16 from qs[32n + 16 + l] with scales[is + 1]; is advances by 2.
  const want: number[] = [];
  let is = 0;
  for (let n = 0; n < 2; n++) {
    for (let j = 0; j < 4; j++) {
      const q = n === 0 ? j : 3 - j; // the 2-bit field at shift 2j of 0xe4 / 0x1b
      for (const s of [is, is + 1]) {
        for (let l = 0; l < 16; l++) want.push(1 * (15 - s) * q - 0.5 * (s % 4));
      }
      is += 2;
    }
  }
  assertEquals(Array.from(out), want);
  // element 0: scale 15, q 0, min 0 -> 0; element 32: scale 13, q 1, min 2 -> 13 - 1 = 12;
  // element 128: scale 7, q 3, min 0 -> 21; element 255: scale 0, q 0, min 3 -> -1.5.
  assertEquals([out[0], out[32], out[128], out[255]], [0, 12, 21, -1.5]);
});

Deno.test("dequantize() expands a hand-made Q3_K block: 6-bit scales minus 32, a high bit from hmask", () => {
  // Scales k = 0..15 stored as u_k = 4k + 1 (value 4k - 31): low nibbles of u_0..u_7 in bytes
  // 0..7 (low) and of u_8..u_15 (high): 1, 5, 9, 13 repeating -> 0x11, 0x55, 0x99, 0xdd. The
  // top 2 bits of u_k (k >> 2) go to byte 8 + k%4 at bit 2*(k >> 2): 0, 1, 2, 3 -> 0xe4.
  const scales = [0x11, 0x55, 0x99, 0xdd, 0x11, 0x55, 0x99, 0xdd, 0xe4, 0xe4, 0xe4, 0xe4];
  // hmask[l]: bits 0..3 (half 0) set for l < 16, bits 4..7 (half 1) set for l >= 16.
  const hmask = Array.from({ length: 32 }, (_, l) => (l < 16 ? 0x0f : 0xf0));
  const bytes = [...hmask, ...twoBitQs, ...scales, ...le16(0x3800)];
  assertEquals(bytes.length, 110);
  const out = dequantize(tensor("q3_k", [256], bytes));
  // ggml: d = 0.5; for half n, shift j (mask bit m = 4n + j): 16 elements from q[l] and
  // hm[l] with scale is, 16 from q[l + 16] and hm[l + 16] with scale is + 1; a clear hmask
  // bit subtracts 4 from the 2-bit quant.
  const want: number[] = [];
  let is = 0;
  for (let n = 0; n < 2; n++) {
    for (let j = 0; j < 4; j++) {
      const q = n === 0 ? j : 3 - j;
      for (const [s, first] of [[is, true], [is + 1, false]] as const) {
        const set = n === 0 ? first : !first; // 0x0f for l < 16, 0xf0 for l >= 16
        for (let l = 0; l < 16; l++) want.push(0.5 * (4 * s - 31) * (q - (set ? 0 : 4)));
      }
      is += 2;
    }
  }
  assertEquals(Array.from(out), want);
  // element 0: scale -31, q 0 with the bit set -> -0; element 16: scale -27, q 0 - 4 -> 54;
  // element 224: scale 25, q 0 - 4 -> -50; element 255: scale 29, q 0 with the bit set -> 0.
  assertEquals([out[16], out[224], out[255]], [54, -50, 0]);
});

// Q4_K/Q5_K scales: sub-block s has scale 10 + 7s and min 63 - 5s (6 bits each). Bytes 0..3:
// scale s (s < 4) | top 2 bits of scale s + 4 at bit 6; bytes 4..7: min s | top 2 bits of min
// s + 4; bytes 8..11: low 4 bits of scale s + 4 | low 4 bits of min s + 4 << 4.
// scales 4..7 = 38, 45, 52, 59 (top 2, 2, 3, 3; low 6, 13, 4, 11),
// mins 4..7 = 43, 38, 33, 28 (top 2, 2, 2, 1; low 11, 6, 1, 12).
const kScales = [
  10 | (2 << 6),
  17 | (2 << 6),
  24 | (3 << 6),
  31 | (3 << 6),
  63 | (2 << 6),
  58 | (2 << 6),
  53 | (2 << 6),
  48 | (1 << 6),
  6 | (11 << 4),
  13 | (6 << 4),
  4 | (1 << 4),
  11 | (12 << 4),
];
const kScale = (s: number) => 10 + 7 * s;
const kMin = (s: number) => 63 - 5 * s;
// qs[32p + l]: low nibble l % 16 (sub-block 2p), high nibble 15 - l % 16 (sub-block 2p + 1).
const kQs = Array.from({ length: 128 }, (_, i) => (i % 16) | ((15 - (i % 16)) << 4));

Deno.test("dequantize() expands a hand-made Q4_K block: d * scale * q - dmin * min per 32 elements", () => {
  const bytes = [...le16(0x3400), ...le16(0x3000), ...kScales, ...kQs];
  assertEquals(bytes.length, 144);
  const out = dequantize(tensor("q4_k", [256], bytes));
  // ggml: d = 0.25, dmin = 0.125; per 64 elements, 32 low nibbles of q[l] with (scale, min)
  // is, then 32 high nibbles with is + 1.
  const want: number[] = [];
  for (let is = 0; is < 8; is += 2) {
    for (let l = 0; l < 32; l++) want.push(0.25 * kScale(is) * (l % 16) - 0.125 * kMin(is));
    for (let l = 0; l < 32; l++) {
      want.push(0.25 * kScale(is + 1) * (15 - (l % 16)) - 0.125 * kMin(is + 1));
    }
  }
  assertEquals(Array.from(out), want);
  // element 1: 0.25*10*1 - 0.125*63 = -5.375; element 255: 0.25*59*0 - 0.125*28 = -3.5;
  // element 224: 0.25*59*15 - 3.5 = 217.75.
  assertEquals([out[1], out[224], out[255]], [-5.375, 217.75, -3.5]);
});

Deno.test("dequantize() expands a hand-made Q5_K block: as Q4_K, with a fifth bit from qh", () => {
  // qh[l] = 0x55 for l < 16 (even sub-blocks get +16), 0xaa for l >= 16 (odd ones).
  const qh = Array.from({ length: 32 }, (_, l) => (l < 16 ? 0x55 : 0xaa));
  const bytes = [...le16(0x3400), ...le16(0x3000), ...kScales, ...qh, ...kQs];
  assertEquals(bytes.length, 176);
  const out = dequantize(tensor("q5_k", [256], bytes));
  // ggml: per 64 elements, masks u1 = 1 << is, u2 = 2 << is on qh[l].
  const want: number[] = [];
  for (let is = 0; is < 8; is += 2) {
    for (let l = 0; l < 32; l++) {
      want.push(0.25 * kScale(is) * ((l % 16) + (l < 16 ? 16 : 0)) - 0.125 * kMin(is));
    }
    for (let l = 0; l < 32; l++) {
      want.push(
        0.25 * kScale(is + 1) * (15 - (l % 16) + (l >= 16 ? 16 : 0)) - 0.125 * kMin(is + 1),
      );
    }
  }
  assertEquals(Array.from(out), want);
  // element 0: 0.25*10*16 - 7.875 = 32.125; element 240: 0.25*59*(15 + 16) - 3.5 = 453.75.
  assertEquals([out[0], out[240]], [32.125, 453.75]);
});

Deno.test("dequantize() expands a hand-made Q6_K block: d * int8 scale * (6-bit q - 32) per 16 elements", () => {
  // ql[i] = i (i < 128), qh[i] = 0xe4 for i < 32 (2-bit fields 0,1,2,3), 0x1b after
  // (3,2,1,0), int8 scales[i] = 5 * (i - 8), d = 0.0625 (0x2c00).
  const ql = Array.from({ length: 128 }, (_, i) => i);
  const qh = [...new Array(32).fill(0xe4), ...new Array(32).fill(0x1b)];
  const sc = Array.from({ length: 16 }, (_, i) => (5 * (i - 8)) & 0xff);
  const bytes = [...ql, ...qh, ...sc, ...le16(0x2c00)];
  assertEquals(bytes.length, 210);
  const out = dequantize(tensor("q6_k", [256], bytes));
  // ggml, per 128 elements n (ql += 64, qh += 32, sc += 8): for l < 32, is = l / 16:
  //   y[l]      = d * sc[is]     * ((ql[l] & 15      | (qh[l] & 3) << 4)        - 32)
  //   y[l + 32] = d * sc[is + 2] * ((ql[l + 32] & 15 | (qh[l] >> 2 & 3) << 4)   - 32)
  //   y[l + 64] = d * sc[is + 4] * ((ql[l] >> 4      | (qh[l] >> 4 & 3) << 4)   - 32)
  //   y[l + 96] = d * sc[is + 6] * ((ql[l + 32] >> 4 | (qh[l] >> 6 & 3) << 4)   - 32)
  const want = new Array<number>(256);
  const scale = (i: number) => 5 * (i - 8);
  for (let n = 0; n < 2; n++) {
    const h = (k: number) => (n === 0 ? k : 3 - k); // qh's 2-bit field k
    for (let l = 0; l < 32; l++) {
      const a = 64 * n + l, b = 64 * n + l + 32, is = 8 * n + (l >> 4);
      want[128 * n + l] = 0.0625 * scale(is) * (((a & 15) | (h(0) << 4)) - 32);
      want[128 * n + l + 32] = 0.0625 * scale(is + 2) * (((b & 15) | (h(1) << 4)) - 32);
      want[128 * n + l + 64] = 0.0625 * scale(is + 4) * (((a >> 4) | (h(2) << 4)) - 32);
      want[128 * n + l + 96] = 0.0625 * scale(is + 6) * (((b >> 4) | (h(3) << 4)) - 32);
    }
  }
  assertEquals(Array.from(out), want);
  // element 0: scale -40, q (0 | 0) - 32 -> 0.0625 * -40 * -32 = 80;
  // element 255: ql[127] >> 4 = 7, field 0 -> q -25, scale 35 -> -54.6875.
  assertEquals([out[0], out[255]], [80, -54.6875]);
});

/** Which bytes of a block hold quants (the rest are scales); the property tests flip their bits. */
const QUANT_BYTES: Record<string, [number, number][]> = {
  q4_1: [[4, 20]],
  q5_0: [[2, 22]],
  q5_1: [[4, 24]],
  q2_k: [[16, 80]],
  q3_k: [[0, 96]],
  q4_k: [[16, 144]],
  q5_k: [[16, 176]],
  q6_k: [[0, 192]],
};
/** Bits per quant. */
const QUANT_BITS: Record<string, number> = {
  q4_1: 4,
  q5_0: 5,
  q5_1: 5,
  q2_k: 2,
  q3_k: 3,
  q4_k: 4,
  q5_k: 5,
  q6_k: 6,
};

Deno.test("every quant bit of each block type belongs to exactly one element, and each element owns its full bit width", () => {
  for (const type of Object.keys(QUANT_BYTES) as Tensor["type"][]) {
    const elements = type.endsWith("_k") ? 256 : 32;
    const bytes = {
      q4_1: 20,
      q5_0: 22,
      q5_1: 24,
      q2_k: 84,
      q3_k: 110,
      q4_k: 144,
      q5_k: 176,
      q6_k: 210,
    }[
      type as string
    ]!;
    // Scales all nonzero so a changed quant always changes its element: every byte 0x77 gives
    // positive K-quant sub-scales and int8 scales, then f16 d = 1 and min fields 0.5.
    const base = new Array(bytes).fill(0x77);
    const set16 = (at: number, v: number) => base.splice(at, 2, ...le16(v));
    if (type === "q4_1" || type === "q5_1") set16(0, 0x3c00), set16(2, 0x3800);
    if (type === "q5_0") set16(0, 0x3c00);
    if (type === "q2_k") set16(80, 0x3c00), set16(82, 0x3800);
    if (type === "q3_k") set16(108, 0x3c00);
    if (type === "q4_k" || type === "q5_k") set16(0, 0x3c00), set16(2, 0x3800);
    if (type === "q6_k") set16(208, 0x3c00);
    const ref = dequantize(tensor(type, [elements], base));
    const owners = new Array<number>(elements).fill(0);
    for (const [from, to] of QUANT_BYTES[type]!) {
      for (let byte = from; byte < to; byte++) {
        for (let bit = 0; bit < 8; bit++) {
          const flipped = [...base];
          flipped[byte] ^= 1 << bit;
          const out = dequantize(tensor(type, [elements], flipped));
          const changed = [...out.keys()].filter((i) => out[i] !== ref[i]);
          assertEquals(changed.length, 1, `${type} byte ${byte} bit ${bit} changed ${changed}`);
          owners[changed[0]!]!++;
        }
      }
    }
    assertEquals(owners, new Array(elements).fill(QUANT_BITS[type]), type);
  }
});

/** ggml's f32 -> bf16: round to nearest, ties to even (GGML_FP32_TO_BF16), for finite values. */
function bf16Round(x: number): number {
  const bits = new Uint32Array(new Float32Array([x]).buffer)[0]!;
  const rounded = ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) << 16;
  return new Float32Array(new Uint32Array([rounded >>> 0]).buffer)[0]!;
}

Deno.test("the BF16, Q4_1 and Q5_1 stories260K GGUFs (llama-quantize's) dequantize to the F32 weights within each format's error", async () => {
  const f32 = await readGguf(modelFile("stories260K-ctx512.gguf"));
  const expectedTypes: Record<string, Record<string, number>> = {
    bf16: { bf16: 37, f32: 11 },
    q4_1: { q4_1: 31, f16: 5, q8_0: 1, f32: 11 },
    q5_1: { q5_1: 31, f16: 5, q8_0: 1, f32: 11 },
  };
  for (const [suffix, types] of Object.entries(expectedTypes)) {
    const file = await readGguf(modelFile(`compat/stories260K-${suffix}.gguf`));
    const counts: Record<string, number> = {};
    for (const [name, q] of file.tensors) {
      counts[q.type] = (counts[q.type] ?? 0) + 1;
      const ref = f32.tensors.get(name)!;
      assertEquals(q.shape, ref.shape, name);
      const x = dequantize(ref);
      const y = dequantize(q);
      const what = `${suffix} ${name} (${q.type})`;
      if (q.type === "f32") assertEquals(y, x, what);
      else if (q.type === "bf16") assertEquals(y, x.map(bf16Round), what);
      else if (q.type === "f16" || q.type === "q8_0") {
        // Checked against their own bounds by the Q8_0 test above; here: close.
        for (let i = 0; i < x.length; i++) assert(Math.abs(y[i]! - x[i]!) < 0.02, what);
      } else {
        // llama.cpp's quantize_row_q{4,5}_1_ref: per 32 values, min m and d = (max - min) /
        // (2^bits - 1); q = round((x - m) / d) with the f32 d and m, stored as f16 d16, m16.
        // So |x - (d16*q + m16)| <= d/2 + (2^bits - 1) * |d - d16| + |m - m16|.
        const levels = q.type === "q4_1" ? 15 : 31;
        const bytes = q.type === "q4_1" ? 20 : 24;
        const view = new DataView(q.data.buffer, q.data.byteOffset, q.data.byteLength);
        for (let b = 0; b < x.length / 32; b++) {
          const block = x.subarray(b * 32, b * 32 + 32);
          const min = Math.min(...block), max = Math.max(...block);
          const d = Math.fround(Math.fround(max - min) / levels);
          const d16 = f16ToF32(view.getUint16(b * bytes, true));
          const m16 = f16ToF32(view.getUint16(b * bytes + 2, true));
          assertEquals(d16, f16ToF32(f32ToF16(d)), `${what} block ${b} scale`);
          assertEquals(m16, f16ToF32(f32ToF16(min)), `${what} block ${b} min`);
          const bound = d / 2 + levels * Math.abs(d - d16) + Math.abs(min - m16) + 1e-6 * d;
          for (let j = 0; j < 32; j++) {
            const err = Math.abs(y[b * 32 + j]! - block[j]!);
            assert(
              err <= bound,
              `${what}[${b * 32 + j}]: |${y[b * 32 + j]} - ${block[j]}| > ${bound}`,
            );
          }
        }
      }
    }
    assertEquals(counts, types, suffix);
  }
});

/** ‖a − b‖ / ‖b‖. */
function relativeRms(a: Float32Array, b: Float32Array): number {
  let diff = 0, norm = 0;
  for (let i = 0; i < a.length; i++) {
    diff += (a[i]! - b[i]!) ** 2;
    norm += b[i]! ** 2;
  }
  return Math.sqrt(diff / norm);
}

Deno.test("tinyllama-like Q4_K_M and Q5_K_M tensors (Q4_K, Q5_K, Q6_K) agree with the Q4_0 file's copies of the same weights", async () => {
  // The three files were quantized by llama-quantize from one F32 file, so each tensor is the
  // same weights under two quantizations: within quantization noise (Q4_0's alone is ~9% of
  // the weights' RMS here); an element in the wrong place would give ~140%.
  const q4 = await readGguf(modelFile("compat/tinyllama-like-q4_0.gguf"));
  const seen: Record<string, number> = {};
  for (const file of ["tinyllama-like-q4_k_m.gguf", "tinyllama-like-q5_k_m.gguf"]) {
    const other = await readGguf(modelFile(`compat/${file}`));
    for (const [name, t] of other.tensors) {
      if (t.type === "f32") continue;
      const ref = q4.tensors.get(name)!;
      if (ref.type === t.type) continue; // output.weight: Q6_K in all three
      assertEquals(ref.type, "q4_0", name);
      seen[t.type] = (seen[t.type] ?? 0) + 1;
      const err = relativeRms(dequantize(t), dequantize(ref));
      assert(err < 0.15, `${file} ${name} (${t.type}) vs Q4_0: relative RMS difference ${err}`);
    }
  }
  assertEquals(seen, { q4_k: 13, q5_k: 13, q6_k: 4 });
});

Deno.test("every tensor of the compat K-quant files dequantizes to finite values of plausible scale", async () => {
  const files = [
    "tinyllama-like-q4_0.gguf",
    "llama3-like-q4_k_m.gguf",
    "qwen2-like-q4_k_m.gguf",
    "qwen3-like-q4_k_m.gguf",
  ];
  const types = new Set<string>();
  for (const file of files) {
    const g = await readGguf(modelFile(`compat/${file}`));
    for (const [name, t] of g.tensors) {
      types.add(t.type);
      const x = dequantize(t);
      let sq = 0, max = 0;
      for (const v of x) {
        sq += v * v;
        max = Math.max(max, Math.abs(v));
      }
      const rms = Math.sqrt(sq / x.length);
      // make_models.py's weights: matrices of RMS 3e-4 (qwen3-like's attn_k) to 1.5, norms ~1,
      // biases up to 13. A NaN makes max NaN and fails the bound.
      assert(max <= 64, `${file} ${name} (${t.type}): max |w| ${max}`);
      assert(name.endsWith(".bias") || rms > 1e-4, `${file} ${name} (${t.type}): RMS ${rms}`);
    }
  }
  assertEquals([...types].sort(), ["f32", "q4_0", "q4_k", "q5_0", "q6_k", "q8_0"]);
});
