import { assertEquals } from "@std/assert";
import { rowBytes, toDeviceRows } from "../kernels/webgpu/weight_formats.ts";
import { Q2_K, Q3_K, Q4_1, Q4_K, Q5_1, Q5_K, Q6_K } from "../lib/formats/mod.ts";

/** `n` bytes numbered from `from`. */
const seq = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);

Deno.test("toDeviceRows() lays a Q5_0 row out as planes of scales, fifth bits and quants, each padded to 16 bytes", () => {
  // One row of three 22-byte blocks (96 columns): block b's bytes are 100b + 0..21 (d at 0..1,
  // qh at 2..5, qs at 6..21).
  const src = new Uint8Array([...seq(0, 22), ...seq(100, 22), ...seq(200, 22)]);
  // Scales 6 -> 16 bytes, fifth bits 12 -> 16, quants 48: 80.
  assertEquals(rowBytes("q5_0", 96), 80);
  const dst = new Uint8Array(80);
  toDeviceRows("q5_0", 96, src, dst);
  assertEquals([...dst], [
    ...[0, 1, 100, 101, 200, 201], // d0, d1, d2
    ...new Array(10).fill(0),
    ...seq(2, 4), // qh0
    ...seq(102, 4),
    ...seq(202, 4),
    ...new Array(4).fill(0),
    ...seq(6, 16), // qs0
    ...seq(106, 16),
    ...seq(206, 16),
  ]);
});

Deno.test("toDeviceRows() puts Q8_0 and Q4_0 scales before their quants, row by row", () => {
  // Two rows of one 34-byte Q8_0 block each (32 columns).
  const q8 = new Uint8Array([...seq(0, 34), ...seq(50, 34)]);
  assertEquals(rowBytes("q8_0", 32), 48);
  const d8 = new Uint8Array(96);
  toDeviceRows("q8_0", 32, q8, d8);
  const row = (from: number, qs: number) => [
    from,
    from + 1,
    ...new Array(14).fill(0),
    ...seq(from + 2, qs),
  ];
  assertEquals([...d8], [...row(0, 32), ...row(50, 32)]);
  const q4 = new Uint8Array(seq(0, 18));
  assertEquals(rowBytes("q4_0", 32), 32);
  const d4 = new Uint8Array(32);
  toDeviceRows("q4_0", 32, q4, d4);
  assertEquals([...d4], row(0, 16));
});

Deno.test("toDeviceRows() pads each Q6_K block to 224 bytes and Q3_K's to 112 (16-byte starts), and copies word-aligned types as they are", () => {
  const src = new Uint8Array([...seq(0, 210), ...seq(10, 210)].map((b) => b % 256));
  assertEquals(rowBytes("q6_k", 512), 448);
  const dst = new Uint8Array(448);
  toDeviceRows("q6_k", 512, src, dst);
  const zeros = new Array(14).fill(0);
  assertEquals([...dst], [
    ...seq(0, 210).map((b) => b % 256),
    ...zeros,
    ...seq(10, 210).map((b) => b % 256),
    ...zeros,
  ]);
  assertEquals(rowBytes("q3_k", 256), 112);

  const q4k = new Uint8Array(seq(0, 144));
  const out = new Uint8Array(144);
  toDeviceRows("q4_k", 256, q4k, out);
  assertEquals([rowBytes("q4_k", 256), [...out]], [144, [...q4k]]);
});

Deno.test("toDeviceRows() with a row group interleaves the group's rows plane by plane, and a last partial group takes a whole group's bytes", () => {
  // Three rows of one 34-byte Q8_0 block each (32 columns), in groups of 2: row r's bytes are
  // 50r + 0..33 (d at 0..1, qs at 2..33). A row-major device row is 48 bytes (scales padded to 16).
  const src = new Uint8Array([...seq(0, 34), ...seq(50, 34), ...seq(100, 34)]);
  const dst = new Uint8Array(4 * 48);
  toDeviceRows("q8_0", 32, src, dst, 2);
  const zeros = (n: number) => new Array(n).fill(0);
  assertEquals([...dst], [
    // Group 0: both scales, the plane's padding (2 x 16 bytes in all), then both rows' quants.
    ...[0, 1, 50, 51],
    ...zeros(28),
    ...seq(2, 32),
    ...seq(52, 32),
    // Group 1: row 2 alone, in a whole group's 96 bytes.
    ...[100, 101],
    ...zeros(30),
    ...seq(102, 32),
    ...zeros(32),
  ]);
});

Deno.test("the WGSL readers' load widths fit lib/formats' layouts: vec4 runs start on 16 bytes, word reads on 4", () => {
  const [q4_k, q5_k, q6_k, q4_1, q5_1, q3_k, q2_k] = [Q4_K, Q5_K, Q6_K, Q4_1, Q5_1, Q3_K, Q2_K];
  // Q4_K and Q5_K read d, dmin and the 12 scale bytes as the block's first vec4.
  for (const f of [q4_k, q5_k]) {
    assertEquals([f.fields.d.at, f.fields.dmin.at, f.fields.scales.at, f.fields.scales.bytes], [
      0,
      2,
      4,
      12,
    ]);
  }
  const vec4Runs = [q4_k.fields.qs, q5_k.fields.qs, q5_k.fields.qh, q6_k.fields.ql, q6_k.fields.qh];
  for (const { at } of vec4Runs) assertEquals(at % 16, 0, `vec4 run at ${at}`);
  const words = [
    q4_1.fields.qs.at,
    q5_1.fields.qs.at,
    q5_1.fields.qh.at,
    q3_k.fields.scales.at,
    q3_k.fields.qs.at,
    q3_k.fields.hmask.at,
    q3_k.fields.d.at,
    q2_k.fields.qs.at,
    q2_k.fields.d.at,
    q6_k.fields.scales.at,
    q6_k.fields.d.at,
  ];
  for (const at of words) assertEquals(at % 4, 0, `word at ${at}`);
  // d then m (or dmin) in one word, unpacked together.
  for (const f of [q4_1, q5_1]) {
    assertEquals([f.fields.d.at % 4, f.fields.m.at], [0, f.fields.d.at + 2]);
  }
  assertEquals(q2_k.fields.dmin.at, q2_k.fields.d.at + 2);
});
