import { blockFormat } from "./block_format.ts";
import { half } from "./half.ts";

/**
 * 256 6-bit quants minus 32, in 16 groups of 16 with an int8 scale each, under one f16 d.
 * Element e: half n = e>>7, quarter k = (e>>5)&3, l = e&31. Low 4 bits: ql byte
 * 64n + 32(k&1) + l, low nibble for k < 2, else high; top 2 bits: qh byte 32n + l at bit 2k.
 * Its scale is 8n + 2k + (l >= 16).
 */
export const Q6_K = blockFormat(
  { type: "q6_k", ggmlType: 14, elements: 256 },
  [["ql", 128], ["qh", 64], ["scales", 16], ["d", 2]],
  // As ggml's dequantize_row_q6_K: per half, each l reads its two ql bytes and its qh byte
  // once for the four quarters.
  ({ ql, qh, scales, d }) => (u, at, out, o, h) => {
    const dd = half(h, u, at + d.at);
    for (let n = 0; n < 2; n++) {
      const lo = at + ql.at + 64 * n, hi = at + qh.at + 32 * n, sc = at + scales.at + 8 * n;
      for (let l = 0; l < 32; l++) {
        const a = u[lo + l]!, b = u[lo + l + 32]!, bits = u[hi + l]!;
        for (let k = 0; k < 4; k++) {
          const q = (((k & 1 ? b : a) >> (4 * (k >> 1))) & 0xf) | (((bits >> (2 * k)) & 3) << 4);
          const s = (u[sc + 2 * k + (l >> 4)]! << 24) >> 24;
          out[o + 128 * n + 32 * k + l] = Math.fround(dd * s) * (q - 32);
        }
      }
    }
  },
);
