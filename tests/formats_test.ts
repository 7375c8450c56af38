import { assertEquals } from "@std/assert";
import { FORMAT, FORMATS, TENSOR_TYPES } from "../lib/formats/mod.ts";

/**
 * ggml-common.h's block structs, field by field in declaration order with their sizes
 * (QK_K = 256, K_SCALE_SIZE = 12, ggml_half = 2 bytes), and its static_assert sizes: the
 * oracle each lib/formats layout is checked against.
 */
const GGML_COMMON: Record<string, { fields: [string, number][]; size: number }> = {
  q4_0: { fields: [["d", 2], ["qs", 16]], size: 18 },
  q4_1: { fields: [["d", 2], ["m", 2], ["qs", 16]], size: 20 },
  q5_0: { fields: [["d", 2], ["qh", 4], ["qs", 16]], size: 22 },
  q5_1: { fields: [["d", 2], ["m", 2], ["qh", 4], ["qs", 16]], size: 24 },
  q8_0: { fields: [["d", 2], ["qs", 32]], size: 34 },
  q2_k: { fields: [["scales", 16], ["qs", 64], ["d", 2], ["dmin", 2]], size: 84 },
  q3_k: { fields: [["hmask", 32], ["qs", 64], ["scales", 12], ["d", 2]], size: 110 },
  q4_k: { fields: [["d", 2], ["dmin", 2], ["scales", 12], ["qs", 128]], size: 144 },
  q5_k: { fields: [["d", 2], ["dmin", 2], ["scales", 12], ["qh", 32], ["qs", 128]], size: 176 },
  q6_k: { fields: [["ql", 128], ["qh", 64], ["scales", 16], ["d", 2]], size: 210 },
};

Deno.test("each quantized format's fields sit where ggml-common.h's block struct puts them", () => {
  for (const [type, { fields, size }] of Object.entries(GGML_COMMON)) {
    const f = FORMAT[type as keyof typeof FORMAT];
    assertEquals(f.bytes, size, type);
    let at = 0;
    const expected: Record<string, { at: number; bytes: number }> = {};
    for (const [name, bytes] of fields) expected[name] = { at, bytes }, at += bytes;
    assertEquals(f.fields, expected, type);
    assertEquals(f.elements, type.endsWith("_k") ? 256 : 32, type);
  }
  // ggml.h's enum ggml_type numbers, and its type names.
  assertEquals(
    FORMATS.map((f) => [f.ggmlName, f.ggmlType]),
    [
      ["F32", 0],
      ["F16", 1],
      ["BF16", 30],
      ["Q8_0", 8],
      ["Q4_0", 2],
      ["Q4_1", 3],
      ["Q5_0", 6],
      ["Q5_1", 7],
      ["Q2_K", 10],
      ["Q3_K", 11],
      ["Q4_K", 12],
      ["Q5_K", 13],
      ["Q6_K", 14],
    ],
  );
});

Deno.test("the AssemblyScript kernels' type codes, block sizes and field offsets are lib/formats'", () => {
  const source = Deno.readTextFileSync(new URL("../kernels/wasm/as/formats.ts", import.meta.url));
  const constants = new Map(
    [...source.matchAll(/export const (\w+): (?:i32|usize) = (\d+);/g)].map((m) => [m[1]!, +m[2]!]),
  );
  // The CPU engine passes TENSOR_TYPES.indexOf(type) as the type code (wasm_engine.ts).
  for (const [code, type] of TENSOR_TYPES.entries()) {
    assertEquals(constants.get(`T_${type.toUpperCase()}`), code, type);
  }
  let checked = 0;
  for (const f of FORMATS.filter((f) => f.elements > 1)) {
    const name = f.type.toUpperCase();
    assertEquals(constants.get(`${name}_BYTES`), f.bytes, name);
    for (const [field, { at }] of Object.entries(f.fields)) {
      assertEquals(constants.get(`${name}_${field.toUpperCase()}`), at, `${name}.${field}`);
      checked++;
    }
  }
  assertEquals(checked, 35);
});
