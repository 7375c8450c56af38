/**
 * The AssemblyScript view of lib/formats: kernels/wasm/as/ cannot import TypeScript from lib/,
 * so kernels/wasm/build.ts writes this text to kernels/wasm/as/formats.ts before it compiles
 * (and `--check` fails when the committed file differs). The kernels take every type code,
 * block size and field offset from there.
 */
import { type BlockFormat, FORMATS } from "../../lib/formats/mod.ts";

/** The file kernels/wasm/build.ts writes, relative to this module. */
export const FORMATS_AS_FILE = "./as/formats.ts";

const upper = (s: string) => s.toUpperCase();
const INLINE = "// @ts-ignore: decorator\n@inline ";

/** The row-size expression for K elements: a shift, since every block holds 2^n elements. */
function rowBytesOf(f: BlockFormat): string {
  if (f.elements === 1) return `K * ${f.bytes}`;
  return `(K >> ${Math.log2(f.elements)}) * ${f.bytes}`;
}

/** The source of kernels/wasm/as/formats.ts. */
export function formatsSource(): string {
  const lines = [
    "// Generated from lib/formats by kernels/wasm/build.ts (`deno task build:wasm`): do not edit.",
    "// Type codes are indices in lib/formats' FORMATS; offsets are bytes from a block's start.",
    "",
  ];
  FORMATS.forEach((f, i) => lines.push(`export const T_${upper(f.type)}: i32 = ${i};`));
  for (const f of FORMATS) {
    if (f.elements === 1) continue;
    const name = upper(f.type);
    lines.push("", `/** ${f.ggmlName}: ${f.elements} elements in ${f.bytes} bytes. */`);
    lines.push(`export const ${name}_BYTES: usize = ${f.bytes};`);
    for (const [field, { at }] of Object.entries(f.fields)) {
      lines.push(`export const ${name}_${upper(field)}: usize = ${at};`);
    }
  }
  lines.push(
    "",
    "/** Bytes per block of a type (the element's bytes for the float types). */",
    `${INLINE}export function blockBytes(type: i32): usize {`,
    `  return ${FORMATS.map((f) => `type == T_${upper(f.type)} ? ${f.bytes}`).join("\n    : ")}`,
    "    : 0;",
    "}",
  );
  lines.push(
    "",
    "/** Bytes of one weight row of K elements. */",
    "export function rowBytes(type: i32, K: i32): i32 {",
    "  switch (type) {",
    ...FORMATS.map((f) => `    case T_${upper(f.type)}: return ${rowBytesOf(f)};`),
    "  }",
    "  return 0;",
    "}",
    "",
  );
  return lines.join("\n");
}
