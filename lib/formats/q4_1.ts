import { blockFormat } from "./block_format.ts";
import { half } from "./half.ts";

/** 32 4-bit quants times one f16 scale, plus an f16 minimum. Nibbles as Q4_0's. */
export const Q4_1 = blockFormat(
  { type: "q4_1", ggmlType: 3, elements: 32 },
  [["d", 2], ["m", 2], ["qs", 16]],
  ({ d, m, qs }) => (u, at, out, o, h) => {
    const scale = half(h, u, at + d.at);
    const min = half(h, u, at + m.at);
    for (let j = 0; j < 16; j++) {
      const q = u[at + qs.at + j]!;
      out[o + j] = scale * (q & 0xf) + min;
      out[o + j + 16] = scale * (q >> 4) + min;
    }
  },
);
