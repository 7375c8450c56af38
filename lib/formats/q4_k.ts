import { blockFormat, type Field, type OneBlock } from "./block_format.ts";
import { half } from "./half.ts";

/**
 * Scale and min j (0..7) of a Q4_K/Q5_K block: 6 bits each, packed in 12 bytes. Bytes 0..3
 * hold scales 0..3 and bytes 4..7 mins 0..3 in their low 6 bits; scales and mins 4..7 take
 * their low 4 bits from bytes 8..11 (scale low nibble, min high nibble) and their top 2 bits
 * from the spare top bits of bytes 0..3 (scales) and 4..7 (mins). `at` is the scales field.
 */
export function kScaleMin(u: Uint8Array, at: number, j: number): [number, number] {
  if (j < 4) return [u[at + j]! & 63, u[at + j + 4]! & 63];
  const lo = u[at + j + 4]!;
  return [(lo & 0xf) | ((u[at + j - 4]! >> 6) << 4), (lo >> 4) | ((u[at + j]! >> 6) << 4)];
}

/**
 * Q4_K and Q5_K: sub-block s = e>>5 (32 elements) has its own 6-bit scale and min; pair s>>1
 * shares 32 qs bytes, the even sub-block taking low nibbles, the odd one high nibbles. Q5_K's
 * fifth bit of element e is bit s of qh[e&31].
 */
export function kBlock(
  f: { d: Field; dmin: Field; scales: Field; qs: Field; qh?: Field },
): OneBlock {
  const { d, dmin, scales, qs, qh } = f;
  return (u, at, out, o, h) => {
    const dd = half(h, u, at + d.at);
    const dm = half(h, u, at + dmin.at);
    for (let s = 0; s < 8; s++) {
      const [sc, mn] = kScaleMin(u, at + scales.at, s);
      const ds = dd * sc, ms = dm * mn;
      const shift = 4 * (s & 1);
      for (let l = 0; l < 32; l++) {
        let q = (u[at + qs.at + 32 * (s >> 1) + l]! >> shift) & 0xf;
        if (qh) q |= ((u[at + qh.at + l]! >> s) & 1) << 4;
        out[o + 32 * s + l] = ds * q - ms;
      }
    }
  };
}

export const Q4_K = blockFormat(
  { type: "q4_k", ggmlType: 12, elements: 256 },
  [["d", 2], ["dmin", 2], ["scales", 12], ["qs", 128]],
  kBlock,
);
