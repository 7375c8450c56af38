import { blockFormat } from "./block_format.ts";
import { byElement } from "./super_block.ts";

/**
 * 256 2-bit quants in 16 groups of 16, each group with a 4-bit scale (low nibble of its scales
 * byte) and a 4-bit minimum (high nibble), under the f16 d and dmin. Element e: half n = e>>7
 * and shift 2j (j = (e>>5)&3) of qs byte 32n + (e&31); its group is 8n + 2j + (e&31 >= 16).
 */
export const Q2_K = blockFormat(
  { type: "q2_k", ggmlType: 10, elements: 256 },
  [["scales", 16], ["qs", 64], ["d", 2], ["dmin", 2]],
  ({ scales, qs, d, dmin }) =>
    byElement(d, dmin, (u, at, n, j, l, dd, dm) => {
      const sc = u[at + scales.at + 8 * n + 2 * j + (l >> 4)]!;
      const q = (u[at + qs.at + 32 * n + l]! >> (2 * j)) & 3;
      return dd * (sc & 0xf) * q - dm * (sc >> 4);
    }),
);
