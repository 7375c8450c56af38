import { blockFormat, type Field, type OneBlock } from "./block_format.ts";
import { half } from "./half.ts";

/**
 * Q5_0 and Q5_1: Q4_0's and Q4_1's nibbles plus a fifth bit each, bit j of the 32-bit qh being
 * element j's. Q5_0 subtracts 16; Q5_1 adds its minimum m.
 */
function q5Block(f: { d: Field; m?: Field; qh: Field; qs: Field }): OneBlock {
  const { d, m, qh, qs } = f;
  const zero = m ? 0 : 16;
  return (u, at, out, o, h) => {
    const scale = half(h, u, at + d.at);
    const min = m ? half(h, u, at + m.at) : 0;
    const hAt = at + qh.at;
    const bits = (u[hAt]! | (u[hAt + 1]! << 8) | (u[hAt + 2]! << 16) | (u[hAt + 3]! << 24)) >>> 0;
    for (let j = 0; j < 16; j++) {
      const q = u[at + qs.at + j]!;
      const q0 = (q & 0xf) | (((bits >>> j) & 1) << 4);
      const q1 = (q >> 4) | (((bits >>> (j + 16)) & 1) << 4);
      out[o + j] = scale * (q0 - zero) + min;
      out[o + j + 16] = scale * (q1 - zero) + min;
    }
  };
}

export const Q5_0 = blockFormat(
  { type: "q5_0", ggmlType: 6, elements: 32 },
  [["d", 2], ["qh", 4], ["qs", 16]],
  q5Block,
);

export const Q5_1 = blockFormat(
  { type: "q5_1", ggmlType: 7, elements: 32 },
  [["d", 2], ["m", 2], ["qh", 4], ["qs", 16]],
  q5Block,
);
