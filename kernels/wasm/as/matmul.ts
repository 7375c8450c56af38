// Matrix × activation rows for every GGUF weight type, reading the weights in their file
// encoding. Each output element is reduced in one fixed order (blocks in sequence, lanes
// summed as hsum does), whatever the number of rows in the step or the thread that computes
// it: a sequence's logits are the same alone or in a batch, on 1 thread or 8.
//
// A weight row is read once for a tile of up to 4 activation rows; the tile's rows share its
// unpacking. Weights are unpacked to unsigned values below 128 (offsets and minimums are
// applied through the activations' block sums), so relaxed SIMD's i8×i7 dot product is exact.

import { C_BIT16, C_M30, C_M4, h2f, h2f_hi, h2f_lo, h2fScale, hsum, pairs16, vc, ZERO } from "./simd";
import { matmulQ4_0, matmulQ4_1, matmulQ5_0, matmulQ5_1, matmulQ8_0, put } from "./legacy";
import {
  ACT_BS16,
  ACT_BS32,
  ACT_D256,
  ACT_F,
  ACT_Q256,
} from "./quantize";

// Type codes: the index of the type in TENSOR_TYPES (lib/model/tensor.ts).
export const T_F32: i32 = 0;
export const T_F16: i32 = 1;
export const T_BF16: i32 = 2;
export const T_Q8_0: i32 = 3;
export const T_Q4_0: i32 = 4;
export const T_Q4_1: i32 = 5;
export const T_Q5_0: i32 = 6;
export const T_Q5_1: i32 = 7;
export const T_Q2_K: i32 = 8;
export const T_Q3_K: i32 = 9;
export const T_Q4_K: i32 = 10;
export const T_Q5_K: i32 = 11;
export const T_Q6_K: i32 = 12;

// One tile's results (globals are per instance, so per thread).
let R0: f32 = 0;
let R1: f32 = 0;
let R2: f32 = 0;
let R3: f32 = 0;

/** Bytes of one weight row of K elements. */
export function rowBytes(type: i32, K: i32): i32 {
  switch (type) {
    case T_F32: return K * 4;
    case T_F16: return K * 2;
    case T_BF16: return K * 2;
    case T_Q8_0: return (K >> 5) * 34;
    case T_Q4_0: return (K >> 5) * 18;
    case T_Q4_1: return (K >> 5) * 20;
    case T_Q5_0: return (K >> 5) * 22;
    case T_Q5_1: return (K >> 5) * 24;
    case T_Q2_K: return (K >> 8) * 84;
    case T_Q3_K: return (K >> 8) * 110;
    case T_Q4_K: return (K >> 8) * 144;
    case T_Q5_K: return (K >> 8) * 176;
    case T_Q6_K: return (K >> 8) * 210;
  }
  return 0;
}

// Integer dot products of a 32-element sub-block: pair sums in i16 (sub-block sums stay
// within i16 for weights below 64), widened or scaled by pmaddwd into i32 lanes.

/** is + Σ sc·w·a over 32 elements; sc is an i16 splat (scales up to 63). */
// @ts-ignore: decorator
@inline function kacc32(is: v128, q: usize, w0: v128, w1: v128, sc: v128): v128 {
  const p = i16x8.add(pairs16(v128.load(q), w0), pairs16(v128.load(q, 16), w1));
  return i32x4.add(is, i32x4.dot_i16x8_s(p, sc));
}

/** is + Σ over two 16-element groups with their own scales (i16 splats, signed). */
// @ts-ignore: decorator
@inline function kacc16(is: v128, q: usize, w0: v128, w1: v128, sa: v128, sb: v128): v128 {
  return i32x4.add(
    is,
    i32x4.add(
      i32x4.dot_i16x8_s(pairs16(v128.load(q), w0), sa),
      i32x4.dot_i16x8_s(pairs16(v128.load(q, 16), w1), sb),
    ),
  );
}

// ---- K-quants: Q8_K activations (d256, bs16, bs32) ----------------------------------------

// @ts-ignore: decorator
@inline function k_kquant(type: i32, wr: usize, K: i32, desc: usize, b: i32, nr: i32): void {
  const nsb = K >> 8;
  const qo0 = load<usize>(desc + ACT_Q256) + <usize>b * <usize>K;
  const ds = load<usize>(desc + ACT_D256) + (<usize>(b * nsb) << 2);
  const b16 = load<usize>(desc + ACT_BS16) + (<usize>(b * (K >> 4)) << 1);
  const b32 = load<usize>(desc + ACT_BS32) + (<usize>(b * (K >> 5)) << 1);
  const qk = <usize>K;
  const dk = <usize>nsb << 2;
  const k16 = <usize>(K >> 4) << 1;
  const k32 = <usize>(K >> 5) << 1;
  const M4 = vc(C_M4), M30 = vc(C_M30), BIT16 = vc(C_BIT16);
  let a0 = f32x4.splat(0), a1 = f32x4.splat(0), a2 = f32x4.splat(0), a3 = f32x4.splat(0);
  let e0 = f32x4.splat(0), e1 = f32x4.splat(0), e2 = f32x4.splat(0), e3 = f32x4.splat(0);
  for (let j = 0; j < nsb; j++) {
    const qo = qo0 + (<usize>j << 8);
    let i0 = ZERO, i1 = ZERO, i2 = ZERO, i3 = ZERO;
    // Offset terms Σ offset_g × (block sum g) as i32 lanes, from 16-bit block sums.
    let o0 = ZERO, o1 = ZERO, o2 = ZERO, o3 = ZERO;
    let dw: f32 = 0, dm: f32 = 0;
    if (type == T_Q4_K || type == T_Q5_K) {
      const bp = wr + <usize>j * (type == T_Q4_K ? 144 : 176);
      dw = h2fScale(load<u16>(bp));
      dm = -h2fScale(load<u16>(bp + 2));
      let u0 = load<u32>(bp + 4), u1 = load<u32>(bp + 8);
      const u2 = load<u32>(bp + 12);
      const u3 = ((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4);
      const mins03 = u1 & 0x3f3f3f3f;
      u1 = (u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4);
      u0 &= 0x3f3f3f3f;
      // The 8 scales and 8 minimums as i16 lanes.
      const scv = i16x8.extend_low_i8x16_u(i32x4.replace_lane(i32x4.splat(<i32>u0), 1, <i32>u1));
      const mnv = i16x8.extend_low_i8x16_u(i32x4.replace_lane(i32x4.splat(<i32>mins03), 1, <i32>u3));
      const bo = b32 + (<usize>j << 4);
      o0 = i32x4.dot_i16x8_s(mnv, v128.load(bo));
      if (nr == 4) {
        o1 = i32x4.dot_i16x8_s(mnv, v128.load(bo + k32));
        o2 = i32x4.dot_i16x8_s(mnv, v128.load(bo + 2 * k32));
        o3 = i32x4.dot_i16x8_s(mnv, v128.load(bo + 3 * k32));
      }
      const qs = bp + (type == T_Q4_K ? 16 : 48);
      let h0 = ZERO, h1 = ZERO;
      if (type == T_Q5_K) {
        h0 = v128.load(bp + 16);
        h1 = v128.load(bp + 32);
      }
      // The four chunks (and Q6_K's eight sub-blocks below) are written out rather than looped:
      // the shift counts and shuffle lanes must be constants. A loop over helpers with run-time
      // counts and swizzle masks measured 2.2x slower for Q6_K and 1.15x for Q4_K (8192 x 2048,
      // one row, one thread).
      { // chunk 0: sub-blocks 0 (low nibbles) and 1 (high nibbles)
        const x0 = v128.load(qs, 0), x1 = v128.load(qs, 16);
        let w0 = v128.and(x0, M4), w1 = v128.and(x1, M4);
        let w2 = v128.and(i16x8.shr_u(x0, 4), M4), w3 = v128.and(i16x8.shr_u(x1, 4), M4);
        if (type == T_Q5_K) {
          w0 = v128.or(w0, v128.and(i16x8.shl(h0, 4), BIT16));
          w1 = v128.or(w1, v128.and(i16x8.shl(h1, 4), BIT16));
          w2 = v128.or(w2, v128.and(i16x8.shl(h0, 3), BIT16));
          w3 = v128.or(w3, v128.and(i16x8.shl(h1, 3), BIT16));
        }
        const sa = i8x16.shuffle(scv, scv, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1);
        const sb = i8x16.shuffle(scv, scv, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
        i0 = kacc32(kacc32(i0, qo + 0, w0, w1, sa), qo + 32, w2, w3, sb);
        if (nr == 4) {
          i1 = kacc32(kacc32(i1, qo + qk + 0, w0, w1, sa), qo + qk + 32, w2, w3, sb);
          i2 = kacc32(kacc32(i2, qo + 2 * qk + 0, w0, w1, sa), qo + 2 * qk + 32, w2, w3, sb);
          i3 = kacc32(kacc32(i3, qo + 3 * qk + 0, w0, w1, sa), qo + 3 * qk + 32, w2, w3, sb);
        }
      }
      { // chunk 1: sub-blocks 2 (low nibbles) and 3 (high nibbles)
        const x0 = v128.load(qs, 32), x1 = v128.load(qs, 48);
        let w0 = v128.and(x0, M4), w1 = v128.and(x1, M4);
        let w2 = v128.and(i16x8.shr_u(x0, 4), M4), w3 = v128.and(i16x8.shr_u(x1, 4), M4);
        if (type == T_Q5_K) {
          w0 = v128.or(w0, v128.and(i16x8.shl(h0, 2), BIT16));
          w1 = v128.or(w1, v128.and(i16x8.shl(h1, 2), BIT16));
          w2 = v128.or(w2, v128.and(i16x8.shl(h0, 1), BIT16));
          w3 = v128.or(w3, v128.and(i16x8.shl(h1, 1), BIT16));
        }
        const sa = i8x16.shuffle(scv, scv, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5);
        const sb = i8x16.shuffle(scv, scv, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7);
        i0 = kacc32(kacc32(i0, qo + 64, w0, w1, sa), qo + 96, w2, w3, sb);
        if (nr == 4) {
          i1 = kacc32(kacc32(i1, qo + qk + 64, w0, w1, sa), qo + qk + 96, w2, w3, sb);
          i2 = kacc32(kacc32(i2, qo + 2 * qk + 64, w0, w1, sa), qo + 2 * qk + 96, w2, w3, sb);
          i3 = kacc32(kacc32(i3, qo + 3 * qk + 64, w0, w1, sa), qo + 3 * qk + 96, w2, w3, sb);
        }
      }
      { // chunk 2: sub-blocks 4 (low nibbles) and 5 (high nibbles)
        const x0 = v128.load(qs, 64), x1 = v128.load(qs, 80);
        let w0 = v128.and(x0, M4), w1 = v128.and(x1, M4);
        let w2 = v128.and(i16x8.shr_u(x0, 4), M4), w3 = v128.and(i16x8.shr_u(x1, 4), M4);
        if (type == T_Q5_K) {
          w0 = v128.or(w0, v128.and(h0, BIT16));
          w1 = v128.or(w1, v128.and(h1, BIT16));
          w2 = v128.or(w2, v128.and(i16x8.shr_u(h0, 1), BIT16));
          w3 = v128.or(w3, v128.and(i16x8.shr_u(h1, 1), BIT16));
        }
        const sa = i8x16.shuffle(scv, scv, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9);
        const sb = i8x16.shuffle(scv, scv, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11);
        i0 = kacc32(kacc32(i0, qo + 128, w0, w1, sa), qo + 160, w2, w3, sb);
        if (nr == 4) {
          i1 = kacc32(kacc32(i1, qo + qk + 128, w0, w1, sa), qo + qk + 160, w2, w3, sb);
          i2 = kacc32(kacc32(i2, qo + 2 * qk + 128, w0, w1, sa), qo + 2 * qk + 160, w2, w3, sb);
          i3 = kacc32(kacc32(i3, qo + 3 * qk + 128, w0, w1, sa), qo + 3 * qk + 160, w2, w3, sb);
        }
      }
      { // chunk 3: sub-blocks 6 (low nibbles) and 7 (high nibbles)
        const x0 = v128.load(qs, 96), x1 = v128.load(qs, 112);
        let w0 = v128.and(x0, M4), w1 = v128.and(x1, M4);
        let w2 = v128.and(i16x8.shr_u(x0, 4), M4), w3 = v128.and(i16x8.shr_u(x1, 4), M4);
        if (type == T_Q5_K) {
          w0 = v128.or(w0, v128.and(i16x8.shr_u(h0, 2), BIT16));
          w1 = v128.or(w1, v128.and(i16x8.shr_u(h1, 2), BIT16));
          w2 = v128.or(w2, v128.and(i16x8.shr_u(h0, 3), BIT16));
          w3 = v128.or(w3, v128.and(i16x8.shr_u(h1, 3), BIT16));
        }
        const sa = i8x16.shuffle(scv, scv, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13);
        const sb = i8x16.shuffle(scv, scv, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15);
        i0 = kacc32(kacc32(i0, qo + 192, w0, w1, sa), qo + 224, w2, w3, sb);
        if (nr == 4) {
          i1 = kacc32(kacc32(i1, qo + qk + 192, w0, w1, sa), qo + qk + 224, w2, w3, sb);
          i2 = kacc32(kacc32(i2, qo + 2 * qk + 192, w0, w1, sa), qo + 2 * qk + 224, w2, w3, sb);
          i3 = kacc32(kacc32(i3, qo + 3 * qk + 192, w0, w1, sa), qo + 3 * qk + 224, w2, w3, sb);
        }
      }
    } else if (type == T_Q6_K) {
      const bp = wr + <usize>j * 210;
      dw = h2fScale(load<u16>(bp + 208));
      dm = dw * -32;
      const scb = v128.load(bp + 192);
      const sLo = i16x8.extend_low_i8x16_s(scb), sHi = i16x8.extend_high_i8x16_s(scb);
      const bo = b16 + (<usize>j << 5);
      o0 = offsetSum16(bo, sLo, sHi);
      if (nr == 4) {
        o1 = offsetSum16(bo + k16, sLo, sHi);
        o2 = offsetSum16(bo + 2 * k16, sLo, sHi);
        o3 = offsetSum16(bo + 3 * k16, sLo, sHi);
      }
      { // half 0: elements 0..127
        const qh0 = v128.load(bp, 128), qh1 = v128.load(bp, 144);
        const xa0 = v128.load(bp, 0), xa1 = v128.load(bp, 16);
        const xb0 = v128.load(bp, 32), xb1 = v128.load(bp, 48);
        {
          const w0 = v128.or(v128.and(xa0, M4), v128.and(i16x8.shl(qh0, 4), M30));
          const w1 = v128.or(v128.and(xa1, M4), v128.and(i16x8.shl(qh1, 4), M30));
          const sa = i8x16.shuffle(sLo, sLo, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1);
          const sb = i8x16.shuffle(sLo, sLo, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
          i0 = kacc16(i0, qo + 0, w0, w1, sa, sb);
          if (nr == 4) {
            i1 = kacc16(i1, qo + qk + 0, w0, w1, sa, sb);
            i2 = kacc16(i2, qo + 2 * qk + 0, w0, w1, sa, sb);
            i3 = kacc16(i3, qo + 3 * qk + 0, w0, w1, sa, sb);
          }
        }
        {
          const w0 = v128.or(v128.and(xb0, M4), v128.and(i16x8.shl(qh0, 2), M30));
          const w1 = v128.or(v128.and(xb1, M4), v128.and(i16x8.shl(qh1, 2), M30));
          const sa = i8x16.shuffle(sLo, sLo, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5);
          const sb = i8x16.shuffle(sLo, sLo, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7);
          i0 = kacc16(i0, qo + 32, w0, w1, sa, sb);
          if (nr == 4) {
            i1 = kacc16(i1, qo + qk + 32, w0, w1, sa, sb);
            i2 = kacc16(i2, qo + 2 * qk + 32, w0, w1, sa, sb);
            i3 = kacc16(i3, qo + 3 * qk + 32, w0, w1, sa, sb);
          }
        }
        {
          const w0 = v128.or(v128.and(i16x8.shr_u(xa0, 4), M4), v128.and(qh0, M30));
          const w1 = v128.or(v128.and(i16x8.shr_u(xa1, 4), M4), v128.and(qh1, M30));
          const sa = i8x16.shuffle(sLo, sLo, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9);
          const sb = i8x16.shuffle(sLo, sLo, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11);
          i0 = kacc16(i0, qo + 64, w0, w1, sa, sb);
          if (nr == 4) {
            i1 = kacc16(i1, qo + qk + 64, w0, w1, sa, sb);
            i2 = kacc16(i2, qo + 2 * qk + 64, w0, w1, sa, sb);
            i3 = kacc16(i3, qo + 3 * qk + 64, w0, w1, sa, sb);
          }
        }
        {
          const w0 = v128.or(v128.and(i16x8.shr_u(xb0, 4), M4), v128.and(i16x8.shr_u(qh0, 2), M30));
          const w1 = v128.or(v128.and(i16x8.shr_u(xb1, 4), M4), v128.and(i16x8.shr_u(qh1, 2), M30));
          const sa = i8x16.shuffle(sLo, sLo, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13);
          const sb = i8x16.shuffle(sLo, sLo, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15);
          i0 = kacc16(i0, qo + 96, w0, w1, sa, sb);
          if (nr == 4) {
            i1 = kacc16(i1, qo + qk + 96, w0, w1, sa, sb);
            i2 = kacc16(i2, qo + 2 * qk + 96, w0, w1, sa, sb);
            i3 = kacc16(i3, qo + 3 * qk + 96, w0, w1, sa, sb);
          }
        }
      }
      { // half 1: elements 128..255
        const qh0 = v128.load(bp, 160), qh1 = v128.load(bp, 176);
        const xa0 = v128.load(bp, 64), xa1 = v128.load(bp, 80);
        const xb0 = v128.load(bp, 96), xb1 = v128.load(bp, 112);
        {
          const w0 = v128.or(v128.and(xa0, M4), v128.and(i16x8.shl(qh0, 4), M30));
          const w1 = v128.or(v128.and(xa1, M4), v128.and(i16x8.shl(qh1, 4), M30));
          const sa = i8x16.shuffle(sHi, sHi, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1);
          const sb = i8x16.shuffle(sHi, sHi, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
          i0 = kacc16(i0, qo + 128, w0, w1, sa, sb);
          if (nr == 4) {
            i1 = kacc16(i1, qo + qk + 128, w0, w1, sa, sb);
            i2 = kacc16(i2, qo + 2 * qk + 128, w0, w1, sa, sb);
            i3 = kacc16(i3, qo + 3 * qk + 128, w0, w1, sa, sb);
          }
        }
        {
          const w0 = v128.or(v128.and(xb0, M4), v128.and(i16x8.shl(qh0, 2), M30));
          const w1 = v128.or(v128.and(xb1, M4), v128.and(i16x8.shl(qh1, 2), M30));
          const sa = i8x16.shuffle(sHi, sHi, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5);
          const sb = i8x16.shuffle(sHi, sHi, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7);
          i0 = kacc16(i0, qo + 160, w0, w1, sa, sb);
          if (nr == 4) {
            i1 = kacc16(i1, qo + qk + 160, w0, w1, sa, sb);
            i2 = kacc16(i2, qo + 2 * qk + 160, w0, w1, sa, sb);
            i3 = kacc16(i3, qo + 3 * qk + 160, w0, w1, sa, sb);
          }
        }
        {
          const w0 = v128.or(v128.and(i16x8.shr_u(xa0, 4), M4), v128.and(qh0, M30));
          const w1 = v128.or(v128.and(i16x8.shr_u(xa1, 4), M4), v128.and(qh1, M30));
          const sa = i8x16.shuffle(sHi, sHi, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9);
          const sb = i8x16.shuffle(sHi, sHi, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11);
          i0 = kacc16(i0, qo + 192, w0, w1, sa, sb);
          if (nr == 4) {
            i1 = kacc16(i1, qo + qk + 192, w0, w1, sa, sb);
            i2 = kacc16(i2, qo + 2 * qk + 192, w0, w1, sa, sb);
            i3 = kacc16(i3, qo + 3 * qk + 192, w0, w1, sa, sb);
          }
        }
        {
          const w0 = v128.or(v128.and(i16x8.shr_u(xb0, 4), M4), v128.and(i16x8.shr_u(qh0, 2), M30));
          const w1 = v128.or(v128.and(i16x8.shr_u(xb1, 4), M4), v128.and(i16x8.shr_u(qh1, 2), M30));
          const sa = i8x16.shuffle(sHi, sHi, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13);
          const sb = i8x16.shuffle(sHi, sHi, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15);
          i0 = kacc16(i0, qo + 224, w0, w1, sa, sb);
          if (nr == 4) {
            i1 = kacc16(i1, qo + qk + 224, w0, w1, sa, sb);
            i2 = kacc16(i2, qo + 2 * qk + 224, w0, w1, sa, sb);
            i3 = kacc16(i3, qo + 3 * qk + 224, w0, w1, sa, sb);
          }
        }
      }
    } else if (type == T_Q3_K) {
      const bp = wr + <usize>j * 110;
      dw = h2fScale(load<u16>(bp + 108));
      dm = dw * -4;
      const a = load<u32>(bp + 96), bb = load<u32>(bp + 100), t = load<u32>(bp + 104);
      const s0 = (a & 0x0f0f0f0f) | ((t & 0x03030303) << 4);
      const s1 = (bb & 0x0f0f0f0f) | (((t >> 2) & 0x03030303) << 4);
      const s2 = ((a >> 4) & 0x0f0f0f0f) | (((t >> 4) & 0x03030303) << 4);
      const s3 = ((bb >> 4) & 0x0f0f0f0f) | (((t >> 6) & 0x03030303) << 4);
      let packed = i32x4.splat(<i32>s0);
      packed = i32x4.replace_lane(packed, 1, <i32>s1);
      packed = i32x4.replace_lane(packed, 2, <i32>s2);
      packed = i32x4.replace_lane(packed, 3, <i32>s3);
      const scv = i8x16.sub(packed, i8x16.splat(32));
      const sLo = i16x8.extend_low_i8x16_s(scv), sHi = i16x8.extend_high_i8x16_s(scv);
      const bo = b16 + (<usize>j << 5);
      o0 = offsetSum16(bo, sLo, sHi);
      if (nr == 4) {
        o1 = offsetSum16(bo + k16, sLo, sHi);
        o2 = offsetSum16(bo + 2 * k16, sLo, sHi);
        o3 = offsetSum16(bo + 3 * k16, sLo, sHi);
      }
      const hm0 = v128.load(bp), hm1 = v128.load(bp, 16);
      for (let n = 0; n < 2; n++) {
        const x0 = v128.load(bp + 32 + (<usize>n << 5));
        const x1 = v128.load(bp + 32 + (<usize>n << 5), 16);
        for (let k = 0; k < 4; k++) {
          const hb = 4 * n + k;
          const w0 = v128.or(
            v128.and(i8x16.shr_u(x0, 2 * k), i8x16.splat(3)),
            i8x16.shl(v128.and(i8x16.shr_u(hm0, hb), i8x16.splat(1)), 2),
          );
          const w1 = v128.or(
            v128.and(i8x16.shr_u(x1, 2 * k), i8x16.splat(3)),
            i8x16.shl(v128.and(i8x16.shr_u(hm1, hb), i8x16.splat(1)), 2),
          );
          const si = 8 * n + 2 * k;
          const sa = i16x8.splat(<i16>scaleByte(scv, si));
          const sb = i16x8.splat(<i16>scaleByte(scv, si + 1));
          const qc = qo + (<usize>(128 * n + 32 * k));
          i0 = kacc16(i0, qc, w0, w1, sa, sb);
          if (nr == 4) {
            i1 = kacc16(i1, qc + qk, w0, w1, sa, sb);
            i2 = kacc16(i2, qc + 2 * qk, w0, w1, sa, sb);
            i3 = kacc16(i3, qc + 3 * qk, w0, w1, sa, sb);
          }
        }
      }
    } else {
      // T_Q2_K
      const bp = wr + <usize>j * 84;
      dw = h2fScale(load<u16>(bp + 80));
      dm = -h2fScale(load<u16>(bp + 82));
      const scv = v128.load(bp);
      const mins = i8x16.shr_u(scv, 4);
      const mLo = i16x8.extend_low_i8x16_u(mins), mHi = i16x8.extend_high_i8x16_u(mins);
      const bo = b16 + (<usize>j << 5);
      o0 = offsetSum16(bo, mLo, mHi);
      if (nr == 4) {
        o1 = offsetSum16(bo + k16, mLo, mHi);
        o2 = offsetSum16(bo + 2 * k16, mLo, mHi);
        o3 = offsetSum16(bo + 3 * k16, mLo, mHi);
      }
      for (let n = 0; n < 2; n++) {
        const x0 = v128.load(bp + 16 + (<usize>n << 5));
        const x1 = v128.load(bp + 16 + (<usize>n << 5), 16);
        for (let k = 0; k < 4; k++) {
          const w0 = v128.and(i8x16.shr_u(x0, 2 * k), i8x16.splat(3));
          const w1 = v128.and(i8x16.shr_u(x1, 2 * k), i8x16.splat(3));
          const si = 8 * n + 2 * k;
          const sa = i16x8.splat(<i16>(load<u8>(bp + si) & 0xf));
          const sb = i16x8.splat(<i16>(load<u8>(bp + si + 1) & 0xf));
          const qc = qo + (<usize>(128 * n + 32 * k));
          i0 = kacc16(i0, qc, w0, w1, sa, sb);
          if (nr == 4) {
            i1 = kacc16(i1, qc + qk, w0, w1, sa, sb);
            i2 = kacc16(i2, qc + 2 * qk, w0, w1, sa, sb);
            i3 = kacc16(i3, qc + 3 * qk, w0, w1, sa, sb);
          }
        }
      }
    }
    // value = dw·da·Σ(scale·q·a) + dm·da·Σ(offset·block sum), lane by lane, the same for every row.
    const jo = <usize>j << 2;
    let da = load<f32>(ds + jo);
    a0 = f32x4.add(a0, f32x4.mul(f32x4.convert_i32x4_s(i0), f32x4.splat(dw * da)));
    e0 = f32x4.add(e0, f32x4.mul(f32x4.convert_i32x4_s(o0), f32x4.splat(dm * da)));
    if (nr == 4) {
      da = load<f32>(ds + dk + jo);
      a1 = f32x4.add(a1, f32x4.mul(f32x4.convert_i32x4_s(i1), f32x4.splat(dw * da)));
      e1 = f32x4.add(e1, f32x4.mul(f32x4.convert_i32x4_s(o1), f32x4.splat(dm * da)));
      da = load<f32>(ds + 2 * dk + jo);
      a2 = f32x4.add(a2, f32x4.mul(f32x4.convert_i32x4_s(i2), f32x4.splat(dw * da)));
      e2 = f32x4.add(e2, f32x4.mul(f32x4.convert_i32x4_s(o2), f32x4.splat(dm * da)));
      da = load<f32>(ds + 3 * dk + jo);
      a3 = f32x4.add(a3, f32x4.mul(f32x4.convert_i32x4_s(i3), f32x4.splat(dw * da)));
      e3 = f32x4.add(e3, f32x4.mul(f32x4.convert_i32x4_s(o3), f32x4.splat(dm * da)));
    }
  }
  R0 = hsum(a0) + hsum(e0);
  R1 = hsum(a1) + hsum(e1);
  R2 = hsum(a2) + hsum(e2);
  R3 = hsum(a3) + hsum(e3);
}

/** Σ scale_g × (block sum g) over a super-block's 16 groups, as i32 lanes (16-bit sums at bo). */
// @ts-ignore: decorator
@inline function offsetSum16(bo: usize, lo: v128, hi: v128): v128 {
  return i32x4.add(i32x4.dot_i16x8_s(lo, v128.load(bo)), i32x4.dot_i16x8_s(hi, v128.load(bo, 16)));
}

// @ts-ignore: decorator
@inline function scaleByte(v: v128, i: i32): i32 {
  // Lane i of a v128 with a lane index known only at run time.
  return <i32>i8x16.extract_lane_s(i8x16.swizzle(v, i8x16.splat(<i8>i)), 0);
}

// ---- float weights: f32 activations ------------------------------------------------------

// @ts-ignore: decorator
@inline function wload(type: i32, p: usize, hi: bool): v128 {
  // 4 weights as f32 from an f32, f16 or bf16 row (p is the element pointer for f32; for the
  // 16-bit types p points at 8 elements and hi picks lanes 4..7).
  if (type == T_F32) return v128.load(p);
  const v = v128.load(p);
  if (type == T_F16) return hi ? h2f_hi(v) : h2f_lo(v);
  return hi
    ? i32x4.shl(i32x4.extend_high_i16x8_u(v), 16)
    : i32x4.shl(i32x4.extend_low_i16x8_u(v), 16);
}

// @ts-ignore: decorator
@inline function wscalar(type: i32, wr: usize, i: i32): f32 {
  if (type == T_F32) return load<f32>(wr + (<usize>i << 2));
  const h = <u32>load<u16>(wr + (<usize>i << 1));
  return type == T_F16 ? h2f(h) : reinterpret<f32>(h << 16);
}

// @ts-ignore: decorator
@inline function k_float(type: i32, wr: usize, K: i32, desc: usize, b: i32, nr: i32): void {
  const f = load<usize>(desc + ACT_F) + (<usize>b * <usize>K << 2);
  const fk = <usize>K << 2;
  const K8 = K & ~7;
  let a0 = f32x4.splat(0), a1 = f32x4.splat(0), a2 = f32x4.splat(0), a3 = f32x4.splat(0);
  for (let i = 0; i < K8; i += 8) {
    let wa: v128, wb: v128;
    if (type == T_F32) {
      wa = v128.load(wr + (<usize>i << 2));
      wb = v128.load(wr + (<usize>i << 2), 16);
    } else {
      wa = wload(type, wr + (<usize>i << 1), false);
      wb = wload(type, wr + (<usize>i << 1), true);
    }
    const o = <usize>i << 2;
    a0 = f32x4.add(a0, f32x4.add(f32x4.mul(wa, v128.load(f + o)), f32x4.mul(wb, v128.load(f + o, 16))));
    if (nr == 4) {
      a1 = f32x4.add(a1, f32x4.add(f32x4.mul(wa, v128.load(f + fk + o)), f32x4.mul(wb, v128.load(f + fk + o, 16))));
      a2 = f32x4.add(a2, f32x4.add(f32x4.mul(wa, v128.load(f + 2 * fk + o)), f32x4.mul(wb, v128.load(f + 2 * fk + o, 16))));
      a3 = f32x4.add(a3, f32x4.add(f32x4.mul(wa, v128.load(f + 3 * fk + o)), f32x4.mul(wb, v128.load(f + 3 * fk + o, 16))));
    }
  }
  let t0: f32 = 0, t1: f32 = 0, t2: f32 = 0, t3: f32 = 0;
  for (let i = K8; i < K; i++) {
    const w = wscalar(type, wr, i);
    const o = <usize>i << 2;
    t0 += w * load<f32>(f + o);
    if (nr == 4) {
      t1 += w * load<f32>(f + fk + o);
      t2 += w * load<f32>(f + 2 * fk + o);
      t3 += w * load<f32>(f + 3 * fk + o);
    }
  }
  R0 = hsum(a0) + t0;
  R1 = hsum(a1) + t1;
  R2 = hsum(a2) + t2;
  R3 = hsum(a3) + t3;
}

// The tile kernels, one function per weight type and tile height: each is compiled with its
// type's branches folded away and no other type's code around it to share registers with.
function tile4_q2k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q2_K, wr, K, desc, b, 4); }
function tile1_q2k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q2_K, wr, K, desc, b, 1); }
function tile4_q3k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q3_K, wr, K, desc, b, 4); }
function tile1_q3k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q3_K, wr, K, desc, b, 1); }
function tile4_q4k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q4_K, wr, K, desc, b, 4); }
function tile1_q4k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q4_K, wr, K, desc, b, 1); }
function tile4_q5k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q5_K, wr, K, desc, b, 4); }
function tile1_q5k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q5_K, wr, K, desc, b, 1); }
function tile4_q6k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q6_K, wr, K, desc, b, 4); }
function tile1_q6k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q6_K, wr, K, desc, b, 1); }
function tile4_f32(wr: usize, K: i32, desc: usize, b: i32): void { k_float(T_F32, wr, K, desc, b, 4); }
function tile1_f32(wr: usize, K: i32, desc: usize, b: i32): void { k_float(T_F32, wr, K, desc, b, 1); }
function tile4_f16(wr: usize, K: i32, desc: usize, b: i32): void { k_float(T_F16, wr, K, desc, b, 4); }
function tile1_f16(wr: usize, K: i32, desc: usize, b: i32): void { k_float(T_F16, wr, K, desc, b, 1); }
function tile4_bf16(wr: usize, K: i32, desc: usize, b: i32): void { k_float(T_BF16, wr, K, desc, b, 4); }
function tile1_bf16(wr: usize, K: i32, desc: usize, b: i32): void { k_float(T_BF16, wr, K, desc, b, 1); }

// @ts-ignore: decorator
@inline function tile(type: i32, wr: usize, K: i32, desc: usize, b: i32, nr: i32): void {
  switch (type) {
    case T_F32: if (nr == 4) tile4_f32(wr, K, desc, b); else tile1_f32(wr, K, desc, b); return;
    case T_F16: if (nr == 4) tile4_f16(wr, K, desc, b); else tile1_f16(wr, K, desc, b); return;
    case T_BF16: if (nr == 4) tile4_bf16(wr, K, desc, b); else tile1_bf16(wr, K, desc, b); return;
    case T_Q2_K: if (nr == 4) tile4_q2k(wr, K, desc, b); else tile1_q2k(wr, K, desc, b); return;
    case T_Q3_K: if (nr == 4) tile4_q3k(wr, K, desc, b); else tile1_q3k(wr, K, desc, b); return;
    case T_Q4_K: if (nr == 4) tile4_q4k(wr, K, desc, b); else tile1_q4k(wr, K, desc, b); return;
    case T_Q5_K: if (nr == 4) tile4_q5k(wr, K, desc, b); else tile1_q5k(wr, K, desc, b); return;
    default: if (nr == 4) tile4_q6k(wr, K, desc, b); else tile1_q6k(wr, K, desc, b);
  }
}
/**
 * out[b·ostride + n] (=, or += with accum) W[n]·act[b] (+ bias[n]) for weight rows n0..n1 and
 * activation rows 0..B.
 */
export function matmul(
  type: i32, w: usize, K: i32, desc: usize, B: i32, out: usize, ostride: i32, bias: usize,
  accum: bool, n0: i32, n1: i32,
): void {
  switch (type) {
    case T_Q8_0: matmulQ8_0(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
    case T_Q4_0: matmulQ4_0(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
    case T_Q4_1: matmulQ4_1(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
    case T_Q5_0: matmulQ5_0(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
    case T_Q5_1: matmulQ5_1(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
  }
  mmRows(type, w, K, desc, B, out, ostride, bias, accum, n0, n1);
}

function mmRows(
  type: i32, w: usize, K: i32, desc: usize, B: i32, out: usize, ostride: i32, bias: usize,
  accum: bool, n0: i32, n1: i32,
): void {
  const rb = <usize>rowBytes(type, K);
  const os = <usize>ostride << 2;
  for (let n = n0; n < n1; n++) {
    const wr = w + <usize>n * rb;
    const on = out + (<usize>n << 2);
    let b = 0;
    for (; b + 4 <= B; b += 4) {
      tile(type, wr, K, desc, b, 4);
      const o = on + <usize>b * os;
      put(o, R0, bias, n, accum);
      put(o + os, R1, bias, n, accum);
      put(o + 2 * os, R2, bias, n, accum);
      put(o + 3 * os, R3, bias, n, accum);
    }
    for (; b < B; b++) {
      tile(type, wr, K, desc, b, 1);
      put(on + <usize>b * os, R0, bias, n, accum);
    }
  }
}
