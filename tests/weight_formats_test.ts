import { assertEquals } from "@std/assert";
import { rowBytes, toDeviceRows } from "../kernels/weight_formats.ts";

/** `n` bytes numbered from `from`. */
const seq = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);

Deno.test("toDeviceRows() puts each two Q5_0 blocks' scales first, then the rest of each, and ends an odd row with a zero block", () => {
  // One row of three 22-byte blocks (96 columns): block b's bytes are 100b + 0..21.
  const src = new Uint8Array([...seq(0, 22), ...seq(100, 22), ...seq(200, 22)]);
  assertEquals(rowBytes("q5_0", 96), 88);
  const dst = new Uint8Array(88);
  toDeviceRows("q5_0", 96, src, dst);
  assertEquals([...dst], [
    ...[0, 1, 100, 101], // d0, d1
    ...seq(2, 20), // qh0, qs0
    ...seq(102, 20), // qh1, qs1
    ...[200, 201, 0, 0], // d2, and the missing block's scale
    ...seq(202, 20),
    ...new Array(20).fill(0),
  ]);
});

Deno.test("toDeviceRows() pads each Q6_K block to 212 bytes and copies word-aligned types as they are", () => {
  const src = new Uint8Array([...seq(0, 210), ...seq(10, 210)].map((b) => b % 256));
  assertEquals(rowBytes("q6_k", 512), 424);
  const dst = new Uint8Array(424);
  toDeviceRows("q6_k", 512, src, dst);
  assertEquals([...dst], [...seq(0, 210), 0, 0, ...seq(10, 210), 0, 0].map((b) => b % 256));

  const q4k = new Uint8Array(seq(0, 144));
  const out = new Uint8Array(144);
  toDeviceRows("q4_k", 256, q4k, out);
  assertEquals([rowBytes("q4_k", 256), [...out]], [144, [...q4k]]);
});
