import { assertEquals, assertThrows } from "@std/assert";
import { unrollLoops } from "../kernels/wasm/unroll.ts";

Deno.test("unrollLoops() writes a marked loop out as one block per index, the index a constant in each", () => {
  const source = [
    "let a = 0;",
    "  for (let t = 0; t < 3; t++) { // unrolled: why",
    "    a += t;",
    "  }",
    "for (let i = 0; i < 2; i++) {",
    "  a -= i;",
    "}",
  ].join("\n");
  assertEquals(
    unrollLoops(source),
    [
      "let a = 0;",
      "  { const t: i32 = 0;",
      "    a += t;",
      "  }",
      "  { const t: i32 = 1;",
      "    a += t;",
      "  }",
      "  { const t: i32 = 2;",
      "    a += t;",
      "  }",
      // An unmarked loop stays a loop.
      "for (let i = 0; i < 2; i++) {",
      "  a -= i;",
      "}",
    ].join("\n"),
  );
});

Deno.test("unrollLoops() unrolls a marked loop inside another, and names the line of one without an end", () => {
  const nested = [
    "for (let n = 0; n < 2; n++) { // unrolled",
    "  for (let k = 0; k < 2; k++) { // unrolled",
    "    f(n, k);",
    "  }",
    "}",
  ].join("\n");
  const calls = unrollLoops(nested).split("\n").filter((l) => l.includes("f(")).length;
  assertEquals(calls, 4);
  assertEquals(unrollLoops(nested).match(/const k: i32 = \d/g), [
    "const k: i32 = 0",
    "const k: i32 = 1",
    "const k: i32 = 0",
    "const k: i32 = 1",
  ]);
  assertThrows(
    () => unrollLoops("x;\n  for (let t = 0; t < 8; t++) { // unrolled\n  f(t);\n", "m.ts"),
    Error,
    'm.ts:2: the loop marked "unrolled" has no "}" at its indent',
  );
});
