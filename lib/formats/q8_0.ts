import { blockFormat } from "./block_format.ts";
import { half } from "./half.ts";

/** 32 int8 quants times one f16 scale. */
export const Q8_0 = blockFormat(
  { type: "q8_0", ggmlType: 8, elements: 32 },
  [["d", 2], ["qs", 32]],
  ({ d, qs }) => (u, at, out, o, h) => {
    const scale = half(h, u, at + d.at);
    for (let j = 0; j < 32; j++) out[o + j] = scale * ((u[at + qs.at + j]! << 24) >> 24);
  },
);
