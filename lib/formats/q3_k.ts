import { blockFormat } from "./block_format.ts";
import { byElement } from "./super_block.ts";

/**
 * Scale j (0..15) of a Q3_K block, 6 bits with an offset of 32: the low 4 bits are byte j's
 * low nibble (j < 8) or byte j-8's high nibble, the top 2 bits come from byte 8 + j%4, at bit
 * 2*floor(j/4). `at` is the scales field.
 */
export function q3kScale(u: Uint8Array, at: number, j: number): number {
  const lo = j < 8 ? u[at + j]! & 0xf : u[at + j - 8]! >> 4;
  const hi = (u[at + 8 + (j % 4)]! >> (2 * (j >> 2))) & 3;
  return (lo | (hi << 4)) - 32;
}

/**
 * As Q2_K's low 2 bits, plus a high bit from hmask[e&31] at bit 4n + j: when clear, the quant
 * is lowered by 4. One signed 6-bit scale per 16 elements, packed in 12 bytes (q3kScale).
 */
export const Q3_K = blockFormat(
  { type: "q3_k", ggmlType: 11, elements: 256 },
  [["hmask", 32], ["qs", 64], ["scales", 12], ["d", 2]],
  ({ hmask, qs, scales, d }) =>
    byElement(d, undefined, (u, at, n, j, l, dd) => {
      const q = (u[at + qs.at + 32 * n + l]! >> (2 * j)) & 3;
      const high = (u[at + hmask.at + l]! >> (4 * n + j)) & 1;
      const sc = q3kScale(u, at + scales.at, 8 * n + 2 * j + (l >> 4));
      return dd * sc * (q - (high ? 0 : 4));
    }),
);
