/**
 * Loop unrolling for the AssemblyScript kernels, which neither asc nor Binaryen does: a loop
 * written `for (let t = 0; t < 8; t++) { // unrolled` becomes 8 blocks, each opening with
 * `const t: i32 = k;`, so shift counts and shuffle lanes that depend on t are constants and
 * the state a body carries to the next lives in registers. The kernels keep one copy of the
 * body in source (kernels/wasm/build.ts applies this as asc reads each file); the copies exist
 * only in the compiler's input.
 */

const LOOP = /^(\s*)for \(let (\w+) = 0; \2 < (\d+); \2\+\+\) \{ \/\/ unrolled\b.*$/;

/** `source` with every marked loop written out; throws where a marked loop has no end. */
export function unrollLoops(source: string, file = "source"): string {
  const lines = source.split("\n");
  const out: string[] = [];
  for (let i = 0; i < lines.length; i++) {
    const m = LOOP.exec(lines[i]!);
    if (!m) {
      out.push(lines[i]!);
      continue;
    }
    const [, indent, name, count] = m;
    const end = lines.findIndex((line, j) => j > i && line === `${indent}}`);
    if (end < 0) {
      throw new Error(`${file}:${i + 1}: the loop marked "unrolled" has no "}" at its indent`);
    }
    const body = unrollLoops(lines.slice(i + 1, end).join("\n"), file);
    for (let k = 0; k < Number(count); k++) {
      out.push(`${indent}{ const ${name}: i32 = ${k};`, body, `${indent}}`);
    }
    i = end;
  }
  return out.join("\n");
}
