import { blockFormat } from "./block_format.ts";
import { half } from "./half.ts";

/**
 * 256 2-bit quants in 16 groups of 16, each group with a 4-bit scale (low nibble of its scales
 * byte) and a 4-bit minimum (high nibble), under the f16 d and dmin. Element e: half n = e>>7
 * and shift 2j (j = (e>>5)&3) of qs byte 32n + (e&31); its group is 8n + 2j + (e&31 >= 16).
 */
export const Q2_K = blockFormat(
  { type: "q2_k", ggmlType: 10, elements: 256 },
  [["scales", 16], ["qs", 64], ["d", 2], ["dmin", 2]],
  ({ scales, qs, d, dmin }) => (u, at, out, o, h) => {
    const dd = half(h, u, at + d.at);
    const dm = half(h, u, at + dmin.at);
    for (let e = 0; e < 256; e++) {
      const n = e >> 7, j = (e >> 5) & 3, l = e & 31;
      const sc = u[at + scales.at + 8 * n + 2 * j + (l >> 4)]!;
      const q = (u[at + qs.at + 32 * n + l]! >> (2 * j)) & 3;
      out[o + e] = dd * (sc & 0xf) * q - dm * (sc >> 4);
    }
  },
);
