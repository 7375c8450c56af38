import type { Field, OneBlock } from "./block_format.ts";
import { half } from "./half.ts";

/**
 * A 256-element K-quant block decoded element by element, as ggml's Q2_K, Q3_K and Q6_K
 * reference loops go: element e is in half n = e>>7, quarter k = (e>>5)&3, at l = e&31; `dd`
 * and `dm` are the block's f16 d and dmin (0 without one).
 */
export function byElement(
  d: Field,
  dmin: Field | undefined,
  value: (
    u: Uint8Array,
    at: number,
    n: number,
    k: number,
    l: number,
    dd: number,
    dm: number,
  ) => number,
): OneBlock {
  return (u, at, out, o, h) => {
    const dd = half(h, u, at + d.at);
    const dm = dmin ? half(h, u, at + dmin.at) : 0;
    for (let e = 0; e < 256; e++) out[o + e] = value(u, at, e >> 7, (e >> 5) & 3, e & 31, dd, dm);
  };
}
