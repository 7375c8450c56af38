import { blockFormat, type Field, type OneBlock } from "./block_format.ts";
import { half } from "./half.ts";

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
 * As Q2_K's low 2 bits (element e: half n = e>>7, shift 2j with j = (e>>5)&3, l = e&31), plus
 * a high bit from hmask[l] at bit 4n + j: when clear, the quant is lowered by 4. One signed
 * 6-bit scale per 16 elements, packed in 12 bytes (q3kScale). As ggml's dequantize_row_q3_K,
 * one scale dl per group g of 16 elements.
 */
function q3Block(f: { hmask: Field; qs: Field; scales: Field; d: Field }): OneBlock {
  const { hmask, qs, scales, d } = f;
  return (u, at, out, o, h) => {
    const dd = half(h, u, at + d.at);
    for (let g = 0; g < 16; g++) {
      const n = g >> 3, j = (g >> 1) & 3, dl = dd * q3kScale(u, at + scales.at, g);
      for (let i = 0; i < 16; i++) {
        const l = 16 * (g & 1) + i;
        const q = (u[at + qs.at + 32 * n + l]! >> (2 * j)) & 3;
        const high = (u[at + hmask.at + l]! >> (4 * n + j)) & 1;
        out[o + 16 * g + i] = dl * (q - (high ? 0 : 4));
      }
    }
  };
}

export const Q3_K = blockFormat(
  { type: "q3_k", ggmlType: 11, elements: 256 },
  [["hmask", 32], ["qs", 64], ["scales", 12], ["d", 2]],
  q3Block,
);
