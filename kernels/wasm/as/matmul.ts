// Matrix × activation rows for every GGUF weight type, reading the weights in their file
// encoding. Each output element is reduced in one fixed order (blocks in sequence, lanes
// summed as hsum does), whatever the number of rows in the step or the thread that computes
// it: a sequence's logits are the same alone or in a batch, on 1 thread or 8.
//
// A weight row is read once for a tile of up to 4 activation rows; the tile's rows share its
// unpacking. Weights are unpacked to unsigned values below 128 (offsets and minimums are
// applied through the activations' block sums), so relaxed SIMD's i8×i7 dot product is exact.

import { C_BIT16, C_BIT4, C_M3, C_M30, C_M4, h2f, h2f4hi, h2f_hi, h2f_lo, h2fScale, hsum, vc, ZERO } from "./simd";
import { kdot, koff, kupdate } from "./kquant_dot";
import { matmulQ4_0, matmulQ4_1, matmulQ5_0, matmulQ5_1, matmulQ8_0, put, put4 } from "./legacy";
import { gemm, gemmServes } from "./gemm";
import {
  ACT_BS16,
  ACT_BS32,
  ACT_D256,
  ACT_F,
  ACT_Q256,
} from "./quantize";
import {
  blockBytes, Q2_K_D, Q2_K_DMIN, Q2_K_QS, Q2_K_SCALES, Q3_K_D, Q3_K_HMASK, Q3_K_QS, Q3_K_SCALES,
  Q4_K_D, Q4_K_DMIN, Q4_K_QS, Q4_K_SCALES, Q5_K_D, Q5_K_DMIN, Q5_K_QH, Q5_K_QS, Q5_K_SCALES,
  Q6_K_D, Q6_K_QH, Q6_K_QL, Q6_K_SCALES, rowBytes, T_BF16, T_F16, T_F32, T_Q2_K, T_Q3_K, T_Q4_0,
  T_Q4_1, T_Q4_K, T_Q5_0, T_Q5_1, T_Q5_K, T_Q6_K, T_Q8_0,
} from "./formats";

// One tile's results (globals are per instance, so per thread).
let R0: f32 = 0;
let R1: f32 = 0;
let R2: f32 = 0;
let R3: f32 = 0;
let R4: f32 = 0;
let R5: f32 = 0;
let R6: f32 = 0;
let R7: f32 = 0;

// ---- K-quants: Q8_K activations (d256, bs16, bs32) ----------------------------------------
//
// One loop over a super-block's 8 sub-blocks of 32 serves every K-quant: per type, a head
// reads the block's scales and offset terms (lib/formats' fields, through ./formats), and an
// unpacker yields sub-block t's weights (w0, w1: elements 32t..32t+15 and +16..31) and scales
// (sa, sb). kernels/wasm/build.ts unrolls the loop as asc reads this file (unroll.ts): t is
// then a constant in each copy, so shift counts, shuffle lanes and load offsets are constants
// and the quants a half shares stay in registers. Run-time counts and lanes had measured 2.2x
// slower for Q6_K, and the loop as written about 1.5x (asc and Binaryen unroll nothing). Each
// K-quant has its own function (matmulQ2_K ...), so the type tests fold away.

/** Each i16 lane of v shifted left by `by` bits, or right (logically) by −by. */
// @ts-ignore: decorator
@inline function shiftBits(v: v128, by: i32): v128 {
  return by > 0 ? i16x8.shl(v, by) : by < 0 ? i16x8.shr_u(v, -by) : v;
}

// @ts-ignore: decorator
@inline function k_kquant(type: i32, wr: usize, K: i32, desc: usize, b: i32, nr: i32): void {
  const per32 = type == T_Q4_K || type == T_Q5_K;
  const nsb = K >> 8;
  const qo0 = load<usize>(desc + ACT_Q256) + <usize>b * <usize>K;
  const ds = load<usize>(desc + ACT_D256) + (<usize>(b * nsb) << 2);
  // Offsets are summed per 32 elements (Q4_K, Q5_K) or per 16, from the 16-bit block sums.
  const kb = per32 ? <usize>(K >> 5) << 1 : <usize>(K >> 4) << 1;
  const bs = load<usize>(desc + (per32 ? ACT_BS32 : ACT_BS16)) + <usize>b * kb;
  const qk = <usize>K;
  const dk = <usize>nsb << 2;
  let a0 = f32x4.splat(0), a1 = f32x4.splat(0), a2 = f32x4.splat(0), a3 = f32x4.splat(0);
  let e0 = f32x4.splat(0), e1 = f32x4.splat(0), e2 = f32x4.splat(0), e3 = f32x4.splat(0);
  let a4 = f32x4.splat(0), a5 = f32x4.splat(0), a6 = f32x4.splat(0), a7 = f32x4.splat(0);
  let e4 = f32x4.splat(0), e5 = f32x4.splat(0), e6 = f32x4.splat(0), e7 = f32x4.splat(0);
  for (let j = 0; j < nsb; j++) {
    const qo = qo0 + (<usize>j << 8);
    const bp = wr + <usize>j * blockBytes(type);
    // Head: d (dw) and the offset factor (dm); sub-block scales s (then s2 from t = 4) and
    // offsets oa, ob as i16 lanes; high bits h0, h1 where the type has them.
    let dw: f32 = 0, dm: f32 = 0;
    let s = ZERO, s2 = ZERO, oa = ZERO, ob = ZERO, h0 = ZERO, h1 = ZERO;
    if (per32) {
      const sp = bp + (type == T_Q4_K ? Q4_K_SCALES : Q5_K_SCALES);
      // d and dmin converted together, in the high halves of lanes 0 and 1 (lanes 2 and 3 hold
      // 1.0, so that only a zero or subnormal d or dmin takes h2f4hi's general path).
      let hv = v128.load(ONE_HI);
      hv = type == T_Q4_K ? v128.load16_lane(bp, hv, 1, Q4_K_D) : v128.load16_lane(bp, hv, 1, Q5_K_D);
      hv = type == T_Q4_K ? v128.load16_lane(bp, hv, 3, Q4_K_DMIN) : v128.load16_lane(bp, hv, 3, Q5_K_DMIN);
      const dd = h2f4hi(hv);
      dw = f32x4.extract_lane(dd, 0);
      dm = -f32x4.extract_lane(dd, 1);
      let u0 = load<u32>(sp), u1 = load<u32>(sp, 4);
      const u2 = load<u32>(sp, 8);
      const u3 = ((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4);
      const mins03 = u1 & 0x3f3f3f3f;
      u1 = (u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4);
      u0 &= 0x3f3f3f3f;
      // The 8 scales and 8 minimums as i16 lanes.
      s = i16x8.extend_low_i8x16_u(i32x4.replace_lane(i32x4.splat(<i32>u0), 1, <i32>u1));
      oa = i16x8.extend_low_i8x16_u(i32x4.replace_lane(i32x4.splat(<i32>mins03), 1, <i32>u3));
      if (type == T_Q5_K) {
        h0 = v128.load(bp + Q5_K_QH);
        h1 = v128.load(bp + Q5_K_QH, 16);
      }
    } else if (type == T_Q6_K) {
      dw = h2fScale(load<u16>(bp + Q6_K_D));
      dm = dw * -32;
      s = v128.load8x8_s(bp + Q6_K_SCALES);
      s2 = v128.load8x8_s(bp + Q6_K_SCALES + 8);
      oa = s;
      ob = s2;
    } else if (type == T_Q3_K) {
      dw = h2fScale(load<u16>(bp + Q3_K_D));
      dm = dw * -4;
      const sp = bp + Q3_K_SCALES;
      const a = load<u32>(sp), bb = load<u32>(sp, 4), t = load<u32>(sp, 8);
      const s0 = (a & 0x0f0f0f0f) | ((t & 0x03030303) << 4);
      const s1 = (bb & 0x0f0f0f0f) | (((t >> 2) & 0x03030303) << 4);
      const sx = ((a >> 4) & 0x0f0f0f0f) | (((t >> 4) & 0x03030303) << 4);
      const sy = ((bb >> 4) & 0x0f0f0f0f) | (((t >> 6) & 0x03030303) << 4);
      let packed = i32x4.splat(<i32>s0);
      packed = i32x4.replace_lane(packed, 1, <i32>s1);
      packed = i32x4.replace_lane(packed, 2, <i32>sx);
      packed = i32x4.replace_lane(packed, 3, <i32>sy);
      const scv = i8x16.sub(packed, i8x16.splat(32));
      s = i16x8.extend_low_i8x16_s(scv);
      s2 = i16x8.extend_high_i8x16_s(scv);
      oa = s;
      ob = s2;
      h0 = v128.load(bp + Q3_K_HMASK);
      h1 = v128.load(bp + Q3_K_HMASK, 16);
    } else {
      // T_Q2_K: a 4-bit scale (low nibble) and minimum (high nibble) per 16 elements.
      dw = h2fScale(load<u16>(bp + Q2_K_D));
      dm = -h2fScale(load<u16>(bp + Q2_K_DMIN));
      const scv = v128.load(bp + Q2_K_SCALES);
      const sc = v128.and(scv, vc(C_M4)), mins = i8x16.shr_u(scv, 4);
      s = i16x8.extend_low_i8x16_u(sc);
      s2 = i16x8.extend_high_i8x16_u(sc);
      oa = i16x8.extend_low_i8x16_u(mins);
      ob = i16x8.extend_high_i8x16_u(mins);
    }
    const bo = bs + (per32 ? <usize>j << 4 : <usize>j << 5);
    const o0 = koff(per32, bo, oa, ob);
    let o1 = ZERO, o2 = ZERO, o3 = ZERO;
    if (nr >= 2) o1 = koff(per32, bo + kb, oa, ob);
    if (nr >= 4) {
      o2 = koff(per32, bo + 2 * kb, oa, ob);
      o3 = koff(per32, bo + 3 * kb, oa, ob);
    }
    let o4 = ZERO, o5 = ZERO, o6 = ZERO, o7 = ZERO;
    if (nr == 8) {
      o4 = koff(per32, bo + 4 * kb, oa, ob);
      o5 = koff(per32, bo + 5 * kb, oa, ob);
      o6 = koff(per32, bo + 6 * kb, oa, ob);
      o7 = koff(per32, bo + 7 * kb, oa, ob);
    }
    let i0 = ZERO, i1 = ZERO, i2 = ZERO, i3 = ZERO, i4 = ZERO, i5 = ZERO, i6 = ZERO, i7 = ZERO;
    let x0 = ZERO, x1 = ZERO, y0 = ZERO, y1 = ZERO;
    for (let t = 0; t < 8; t++) { // unrolled by kernels/wasm/build.ts (unroll.ts)
      let w0: v128, w1: v128;
      if (type == T_Q6_K) {
        // Half n = t/4 has 64 ql bytes (x: the first 32, y: the next) and 32 qh bytes; its
        // sub-blocks take the low nibbles of x, of y, then the high nibbles, with qh's bits
        // 2k, 2k + 1 (k = t % 4) on top.
        if ((t & 3) == 0) {
          x0 = v128.load(bp, Q6_K_QL + 16 * t);
          x1 = v128.load(bp, Q6_K_QL + 16 * t + 16);
          y0 = v128.load(bp, Q6_K_QL + 16 * t + 32);
          y1 = v128.load(bp, Q6_K_QL + 16 * t + 48);
          h0 = v128.load(bp, Q6_K_QH + 8 * t);
          h1 = v128.load(bp, Q6_K_QH + 8 * t + 16);
        }
        const hs = 4 - 2 * (t & 3);
        w0 = v128.or(v128.and(x0, vc(C_M4)), v128.and(shiftBits(h0, hs), vc(C_M30)));
        w1 = v128.or(v128.and(x1, vc(C_M4)), v128.and(shiftBits(h1, hs), vc(C_M30)));
        const n0 = i16x8.shr_u(x0, 4), n1 = i16x8.shr_u(x1, 4);
        x0 = y0;
        x1 = y1;
        y0 = n0;
        y1 = n1;
      } else {
        // 32 qs bytes hold 2 sub-blocks of nibbles (Q4_K, Q5_K: low, then high) or 4 of 2-bit
        // quants (Q3_K, Q2_K); the high bit of sub-block t is bit t of Q5_K's qh (bit 4) or of
        // Q3_K's hmask (bit 2). Loads take immediate offsets: t is a constant in each copy.
        if ((t & (per32 ? 1 : 3)) == 0) {
          x0 = type == T_Q4_K
            ? v128.load(bp, Q4_K_QS + 16 * t)
            : type == T_Q5_K
            ? v128.load(bp, Q5_K_QS + 16 * t)
            : type == T_Q3_K
            ? v128.load(bp, Q3_K_QS + 8 * t)
            : v128.load(bp, Q2_K_QS + 8 * t);
          x1 = type == T_Q4_K
            ? v128.load(bp, Q4_K_QS + 16 * t + 16)
            : type == T_Q5_K
            ? v128.load(bp, Q5_K_QS + 16 * t + 16)
            : type == T_Q3_K
            ? v128.load(bp, Q3_K_QS + 8 * t + 16)
            : v128.load(bp, Q2_K_QS + 8 * t + 16);
        } else {
          x0 = i16x8.shr_u(x0, per32 ? 4 : 2);
          x1 = i16x8.shr_u(x1, per32 ? 4 : 2);
        }
        w0 = v128.and(x0, per32 ? vc(C_M4) : vc(C_M3));
        w1 = v128.and(x1, per32 ? vc(C_M4) : vc(C_M3));
        if (type == T_Q5_K || type == T_Q3_K) {
          const by = type == T_Q5_K ? 4 - t : 2 - t;
          const bit = type == T_Q5_K ? vc(C_BIT16) : vc(C_BIT4);
          w0 = v128.or(w0, v128.and(shiftBits(h0, by), bit));
          w1 = v128.or(w1, v128.and(shiftBits(h1, by), bit));
        }
      }
      // Scales: i16 lane t of s (per32), or lanes 2t and 2t + 1 of s, then s2, for the halves.
      const sv = per32 || t < 4 ? s : s2;
      const p = <u8>(2 * t), q = <u8>(4 * (t & 3)); // byte lanes of scale t, and of 2t % 8
      const sa = splat16(sv, per32 ? p >> 1 : q >> 1);
      const sb = per32 ? sa : splat16(sv, (q >> 1) + 1);
      const qc = qo + (<usize>t << 5);
      i0 = kdot(per32, i0, qc, w0, w1, sa, sb);
      if (nr >= 2) i1 = kdot(per32, i1, qc + qk, w0, w1, sa, sb);
      if (nr >= 4) {
        i2 = kdot(per32, i2, qc + 2 * qk, w0, w1, sa, sb);
        i3 = kdot(per32, i3, qc + 3 * qk, w0, w1, sa, sb);
      }
      if (nr == 8) {
        i4 = kdot(per32, i4, qc + 4 * qk, w0, w1, sa, sb);
        i5 = kdot(per32, i5, qc + 5 * qk, w0, w1, sa, sb);
        i6 = kdot(per32, i6, qc + 6 * qk, w0, w1, sa, sb);
        i7 = kdot(per32, i7, qc + 7 * qk, w0, w1, sa, sb);
      }
    }
    // value = dw·da·Σ(scale·q·a) + dm·da·Σ(offset·block sum), lane by lane, the same for every row.
    const jo = <usize>j << 2;
    let da = load<f32>(ds + jo);
    a0 = kupdate(a0, i0, dw, da);
    e0 = kupdate(e0, o0, dm, da);
    if (nr >= 2) {
      da = load<f32>(ds + dk + jo);
      a1 = kupdate(a1, i1, dw, da);
      e1 = kupdate(e1, o1, dm, da);
    }
    if (nr >= 4) {
      da = load<f32>(ds + 2 * dk + jo);
      a2 = kupdate(a2, i2, dw, da);
      e2 = kupdate(e2, o2, dm, da);
      da = load<f32>(ds + 3 * dk + jo);
      a3 = kupdate(a3, i3, dw, da);
      e3 = kupdate(e3, o3, dm, da);
    }
    if (nr == 8) {
      da = load<f32>(ds + 4 * dk + jo);
      a4 = kupdate(a4, i4, dw, da);
      e4 = kupdate(e4, o4, dm, da);
      da = load<f32>(ds + 5 * dk + jo);
      a5 = kupdate(a5, i5, dw, da);
      e5 = kupdate(e5, o5, dm, da);
      da = load<f32>(ds + 6 * dk + jo);
      a6 = kupdate(a6, i6, dw, da);
      e6 = kupdate(e6, o6, dm, da);
      da = load<f32>(ds + 7 * dk + jo);
      a7 = kupdate(a7, i7, dw, da);
      e7 = kupdate(e7, o7, dm, da);
    }
  }
  R0 = hsum(a0) + hsum(e0);
  R1 = hsum(a1) + hsum(e1);
  R2 = hsum(a2) + hsum(e2);
  R3 = hsum(a3) + hsum(e3);
  if (nr == 8) {
    R4 = hsum(a4) + hsum(e4);
    R5 = hsum(a5) + hsum(e5);
    R6 = hsum(a6) + hsum(e6);
    R7 = hsum(a7) + hsum(e7);
  }
}

/** f16 1.0 in the high halves of lanes 2 and 3. */
const ONE_HI: usize = memory.data<u32>([0, 0, 0x3c000000, 0x3c000000], 16);

// Byte indices that broadcast i16 lane i (i = 0..7) to every lane, at SPLAT16 + 16·i.
const SPLAT16: usize = memory.data<u8>([
  0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
  2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
  4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5,
  6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7,
  8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9,
  10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11,
  12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13,
  14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15,
], 16);

/**
 * i16 lane i of v in every lane: one byte shuffle with its indices read from a table (lane i
 * is a constant in each unrolled copy). Written as an i8x16.shuffle, V8 builds the indices
 * from immediates at each use.
 */
// @ts-ignore: decorator
@inline function splat16(v: v128, i: i32): v128 {
  const sel = v128.load(SPLAT16 + (<usize>i << 4));
  if (ASC_FEATURE_RELAXED_SIMD) return i8x16.relaxed_swizzle(v, sel);
  return i8x16.swizzle(v, sel);
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
function tile2_q2k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q2_K, wr, K, desc, b, 2); }
function tile4_q3k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q3_K, wr, K, desc, b, 4); }
function tile1_q3k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q3_K, wr, K, desc, b, 1); }
function tile2_q3k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q3_K, wr, K, desc, b, 2); }
function tile4_q4k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q4_K, wr, K, desc, b, 4); }
function tile1_q4k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q4_K, wr, K, desc, b, 1); }
function tile2_q4k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q4_K, wr, K, desc, b, 2); }
function tile8_q4k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q4_K, wr, K, desc, b, 8); }
function tile4_q5k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q5_K, wr, K, desc, b, 4); }
function tile1_q5k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q5_K, wr, K, desc, b, 1); }
function tile2_q5k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q5_K, wr, K, desc, b, 2); }
function tile8_q5k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q5_K, wr, K, desc, b, 8); }
function tile4_q6k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q6_K, wr, K, desc, b, 4); }
function tile1_q6k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q6_K, wr, K, desc, b, 1); }
function tile2_q6k(wr: usize, K: i32, desc: usize, b: i32): void { k_kquant(T_Q6_K, wr, K, desc, b, 2); }
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
    case T_Q2_K: if (nr == 4) tile4_q2k(wr, K, desc, b); else if (nr == 2) tile2_q2k(wr, K, desc, b); else tile1_q2k(wr, K, desc, b); return;
    case T_Q3_K: if (nr == 4) tile4_q3k(wr, K, desc, b); else if (nr == 2) tile2_q3k(wr, K, desc, b); else tile1_q3k(wr, K, desc, b); return;
    case T_Q4_K: if (nr == 8) tile8_q4k(wr, K, desc, b); else if (nr == 4) tile4_q4k(wr, K, desc, b); else if (nr == 2) tile2_q4k(wr, K, desc, b); else tile1_q4k(wr, K, desc, b); return;
    case T_Q5_K: if (nr == 8) tile8_q5k(wr, K, desc, b); else if (nr == 4) tile4_q5k(wr, K, desc, b); else if (nr == 2) tile2_q5k(wr, K, desc, b); else tile1_q5k(wr, K, desc, b); return;
    default: if (nr == 4) tile4_q6k(wr, K, desc, b); else if (nr == 2) tile2_q6k(wr, K, desc, b); else tile1_q6k(wr, K, desc, b);
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
  // A prompt's rows: the same sums, each weight row unpacked once for all of them.
  if (gemmServes(type, K, B)) {
    gemm(type, w, K, desc, B, out, ostride, bias, accum, n0, n1);
    return;
  }
  switch (type) {
    case T_Q8_0: matmulQ8_0(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
    case T_Q4_0: matmulQ4_0(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
    case T_Q4_1: matmulQ4_1(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
    case T_Q5_0: matmulQ5_0(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
    case T_Q5_1: matmulQ5_1(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
    case T_Q2_K: matmulQ2_K(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
    case T_Q3_K: matmulQ3_K(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
    case T_Q4_K: matmulQ4_K(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
    case T_Q5_K: matmulQ5_K(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
    case T_Q6_K: matmulQ6_K(w, K, desc, B, out, ostride, bias, accum, n0, n1); return;
  }
  mmRows(type, w, K, desc, B, out, ostride, bias, accum, n0, n1);
}

// One function per K-quant, each with its own copy of k_kquant whose type tests fold away.
function matmulQ2_K(w: usize, K: i32, desc: usize, B: i32, out: usize, os: i32, bias: usize, accum: bool, n0: i32, n1: i32): void {
  mmRows(T_Q2_K, w, K, desc, B, out, os, bias, accum, n0, n1);
}
function matmulQ3_K(w: usize, K: i32, desc: usize, B: i32, out: usize, os: i32, bias: usize, accum: bool, n0: i32, n1: i32): void {
  mmRows(T_Q3_K, w, K, desc, B, out, os, bias, accum, n0, n1);
}
function matmulQ4_K(w: usize, K: i32, desc: usize, B: i32, out: usize, os: i32, bias: usize, accum: bool, n0: i32, n1: i32): void {
  mmRows(T_Q4_K, w, K, desc, B, out, os, bias, accum, n0, n1);
}
function matmulQ5_K(w: usize, K: i32, desc: usize, B: i32, out: usize, os: i32, bias: usize, accum: bool, n0: i32, n1: i32): void {
  mmRows(T_Q5_K, w, K, desc, B, out, os, bias, accum, n0, n1);
}
function matmulQ6_K(w: usize, K: i32, desc: usize, B: i32, out: usize, os: i32, bias: usize, accum: bool, n0: i32, n1: i32): void {
  mmRows(T_Q6_K, w, K, desc, B, out, os, bias, accum, n0, n1);
}

// @ts-ignore: decorator
@inline function mmRows(
  type: i32, w: usize, K: i32, desc: usize, B: i32, out: usize, ostride: i32, bias: usize,
  accum: bool, n0: i32, n1: i32,
): void {
  const rb = <usize>rowBytes(type, K);
  const os = <usize>ostride << 2;
  for (let n = n0; n < n1; n++) {
    const wr = w + <usize>n * rb;
    const on = out + (<usize>n << 2);
    let b = 0;
    // Eight rows at a time where gemm() does not serve them yet (Q4_K, Q5_K below 64 rows): the
    // weights' head and unpacking are shared by twice the rows.
    for (; (type == T_Q4_K || type == T_Q5_K) && b + 8 <= B; b += 8) {
      tile(type, wr, K, desc, b, 8);
      const o = on + <usize>b * os;
      put4(o, os, R0, R1, R2, R3, bias, n, accum);
      put4(o + 4 * os, os, R4, R5, R6, R7, bias, n, accum);
    }
    for (; b + 4 <= B; b += 4) {
      tile(type, wr, K, desc, b, 4);
      put4(on + <usize>b * os, os, R0, R1, R2, R3, bias, n, accum);
    }
    // Two rows left over share the weights' unpacking too (the K-quants; the float types
    // take them one at a time).
    if (type >= T_Q2_K && type <= T_Q6_K && b + 2 <= B) {
      tile(type, wr, K, desc, b, 2);
      const o = on + <usize>b * os;
      put(o, R0, bias, n, accum);
      put(o + os, R1, bias, n, accum);
      b += 2;
    }
    for (; b < B; b++) {
      tile(type, wr, K, desc, b, 1);
      put(on + <usize>b * os, R0, bias, n, accum);
    }
  }
}
