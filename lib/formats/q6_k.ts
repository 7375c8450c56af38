import { blockFormat } from "./block_format.ts";
import { byElement } from "./super_block.ts";

/**
 * 256 6-bit quants minus 32, in 16 groups of 16 with an int8 scale each, under one f16 d.
 * Element e: half n = e>>7, quarter k = (e>>5)&3, l = e&31. Low 4 bits: ql byte
 * 64n + 32(k&1) + l, low nibble for k < 2, else high; top 2 bits: qh byte 32n + l at bit 2k.
 * Its scale is 8n + 2k + (l >= 16).
 */
export const Q6_K = blockFormat(
  { type: "q6_k", ggmlType: 14, elements: 256 },
  [["ql", 128], ["qh", 64], ["scales", 16], ["d", 2]],
  ({ ql, qh, scales, d }) =>
    byElement(d, undefined, (u, at, n, k, l, dd) => {
      const lo = (u[at + ql.at + 64 * n + 32 * (k & 1) + l]! >> (4 * (k >> 1))) & 0xf;
      const hi = (u[at + qh.at + 32 * n + l]! >> (2 * k)) & 3;
      const sc = (u[at + scales.at + 8 * n + 2 * k + (l >> 4)]! << 24) >> 24;
      return Math.fround(dd * sc) * ((lo | (hi << 4)) - 32);
    }),
);
