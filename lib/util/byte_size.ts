const UNITS: Record<string, number> = {
  "": 1,
  b: 1,
  kb: 1e3,
  mb: 1e6,
  gb: 1e9,
  kib: 2 ** 10,
  mib: 2 ** 20,
  gib: 2 ** 30,
};

/**
 * Parses a human byte size such as "256MiB", "1.5GB" or "4096".
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * assertEquals(parseByteSize("256MiB"), 268435456);
 * ```
 */
export function parseByteSize(text: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(text);
  const unit = m?.[2]?.toLowerCase() ?? "";
  const factor = UNITS[unit];
  if (!m || factor === undefined) {
    throw new Error(
      `Cannot parse byte size: expected a number with an optional unit (B, KB, MB, GB, KiB, MiB, GiB), received "${text}"`,
    );
  }
  return Math.floor(Number(m[1]) * factor);
}

/** Formats bytes with a binary unit, e.g. 268435456 -> "256.0 MiB". */
export function formatBytes(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = bytes / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(1)} ${units[i]}`;
}
