/**
 * A markdown table with columns padded to equal width, numbers right-aligned.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * assertEquals(
 *   markdownTable(["kernel", "ms"], [["matmul", "0.12"]]),
 *   "| kernel |   ms |\n|--------|-----:|\n| matmul | 0.12 |\n", // padded; numbers right-aligned
 * );
 * ```
 */
export function markdownTable(
  head: readonly string[],
  rows: readonly (readonly string[])[],
): string {
  const widths = head.map((h, c) => Math.max(h.length, ...rows.map((r) => (r[c] ?? "").length)));
  const numeric = head.map((_, c) =>
    rows.length > 0 && rows.every((r) => /^[-+\d.,%×x –/]*$/.test(r[c] ?? ""))
  );
  const cell = (
    s: string,
    c: number,
  ) => (numeric[c] ? s.padStart(widths[c]!) : s.padEnd(widths[c]!));
  const line = (r: readonly string[]) =>
    `| ${head.map((_, c) => cell(r[c] ?? "", c)).join(" | ")} |`;
  const rule = `|${
    widths.map((w, c) => (numeric[c] ? "-".repeat(w + 1) + ":" : "-".repeat(w + 2))).join("|")
  }|`;
  return [line(head), rule, ...rows.map(line)].join("\n") + "\n";
}
