import { blockFormat } from "./block_format.ts";
import { half } from "./half.ts";

/** 32 4-bit quants, minus 8, times one f16 scale. */
export const Q4_0 = blockFormat(
  { type: "q4_0", ggmlType: 2, elements: 32 },
  [["d", 2], ["qs", 16]],
  // Byte j holds element j in its low nibble and element j + 16 in its high one.
  ({ d, qs }) => (u, at, out, o, h) => {
    const scale = half(h, u, at + d.at);
    for (let j = 0; j < 16; j++) {
      const q = u[at + qs.at + j]!;
      out[o + j] = scale * ((q & 0xf) - 8);
      out[o + j + 16] = scale * ((q >> 4) - 8);
    }
  },
);
