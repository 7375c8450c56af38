import { assertEquals } from "@std/assert";
import { concatRows, interleaveRows } from "../kernels/webgpu/gpu_matrix.ts";
import type { Tensor } from "../lib/model/tensor.ts";

/** An f32 [rows, 2] tensor whose row r holds the bytes base + r (4 x 2 of them). */
function rows(name: string, n: number, base: number): Tensor {
  const data = new Uint8Array(n * 8);
  for (let r = 0; r < n; r++) data.fill(base + r, r * 8, (r + 1) * 8);
  return { name, type: "f32", shape: [n, 2], data };
}

const rowIds = (bytes: Uint8Array) =>
  Array.from({ length: bytes.length / 8 }, (_, i) => bytes[8 * i]);

Deno.test("concatRows() writes any row range of q | k | v straight from the parts, across part boundaries", () => {
  const src = concatRows([rows("q", 3, 10), rows("k", 2, 20), rows("v", 2, 30)], "qkv");
  assertEquals([src.shape, src.byteLength], [[7, 2], 7 * 8]);
  const dst = new Uint8Array(4 * 8);
  src.copyRows(dst, 2, 4);
  assertEquals(rowIds(dst), [12, 20, 21, 30]);
});

Deno.test("interleaveRows() writes gate/up pairs (gate_j at row 2j, up_j at 2j + 1) for any row range", () => {
  const src = interleaveRows(rows("gate", 3, 10), rows("up", 3, 20), "gate_up");
  const dst = new Uint8Array(3 * 8);
  src.copyRows(dst, 1, 3);
  assertEquals(rowIds(dst), [20, 11, 21]);
});
