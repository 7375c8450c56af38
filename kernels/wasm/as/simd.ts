// Small SIMD helpers every kernel shares. AssemblyScript, compiled by kernels/wasm/build.ts.

export const ZERO: v128 = i32x4.splat(0);

// Vector constants are read from this table (vc) rather than written as v128 constants: V8
// builds a v128 constant from immediates at each use, several instructions each time inside
// the loops, and a load from L1 is one. In the Q4_K decode loop this alone measured 1.3x.
const CONSTS: usize = memory.data<u32>([
  0x0f0f0f0f, 0x0f0f0f0f, 0x0f0f0f0f, 0x0f0f0f0f,
  0x30303030, 0x30303030, 0x30303030, 0x30303030,
  0x10101010, 0x10101010, 0x10101010, 0x10101010,
  0x7fff, 0x7fff, 0x7fff, 0x7fff,
  0x38000000, 0x38000000, 0x38000000, 0x38000000,
  0x3ff, 0x3ff, 0x3ff, 0x3ff,
  0x33800000, 0x33800000, 0x33800000, 0x33800000,
  0x7c00, 0x7c00, 0x7c00, 0x7c00,
  0x8000, 0x8000, 0x8000, 0x8000,
  0xc1000000, 0xc1000000, 0xc1000000, 0xc1000000,
  0xc1800000, 0xc1800000, 0xc1800000, 0xc1800000,
  0x04040404, 0x04040404, 0x04040404, 0x04040404,
  0x03030303, 0x03030303, 0x03030303, 0x03030303,
  0x8fffe000, 0x8fffe000, 0x8fffe000, 0x8fffe000,
  0x7c000000, 0x7c000000, 0x7c000000, 0x7c000000,
], 16);
/** Bytes 0x0f. */
export const C_M4: i32 = 0;
/** Bytes 0x30. */
export const C_M30: i32 = 1;
/** Bytes 0x10. */
export const C_BIT16: i32 = 2;
const C_7FFF: i32 = 3;
const C_EXP_REBASE: i32 = 4;
const C_3FF: i32 = 5;
const C_2M24: i32 = 6;
const C_7C00: i32 = 7;
const C_8000: i32 = 8;
/** f32 −8. */
export const C_F_M8: i32 = 9;
/** f32 −16. */
export const C_F_M16: i32 = 10;
/** Bytes 0x04. */
export const C_BIT4: i32 = 11;
/** Bytes 0x03. */
export const C_M3: i32 = 12;
const C_SIGN_EM: i32 = 13;
const C_EXP_HI: i32 = 14;

/** Table constant i (a C_* index). */
// @ts-ignore: decorator
@inline export function vc(i: i32): v128 {
  return v128.load(CONSTS + (<usize>i << 4));
}

/**
 * Pair sums a[2i]·w[2i] + a[2i+1]·w[2i+1] of 16 signed activations and 16 weights in 0..127,
 * as 8 i16 lanes (pmaddubsw): exact, since |a| ≤ 127 keeps each pair within ±32512. The plain
 * build computes the same sums from 16-bit products.
 */
// @ts-ignore: decorator
@inline export function pairs16(a: v128, w: v128): v128 {
  if (ASC_FEATURE_RELAXED_SIMD) {
    return i16x8.relaxed_dot_i8x16_i7x16_s(a, w);
  } else {
    const lo = i16x8.extmul_low_i8x16_s(a, w);
    const hi = i16x8.extmul_high_i8x16_s(a, w);
    return i16x8.add(
      i8x16.shuffle(lo, hi, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29),
      i8x16.shuffle(lo, hi, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31),
    );
  }
}

/**
 * acc + the sums of each 4 products a[4i..4i+3]·w[4i..4i+3] as i32 lanes, w in 0..127: one
 * instruction (vpdpbusd) where the CPU has VNNI, 1.5x the throughput of pairs16 then pmaddwd.
 */
// @ts-ignore: decorator
@inline export function dot4(acc: v128, a: v128, w: v128): v128 {
  if (ASC_FEATURE_RELAXED_SIMD) {
    return i32x4.relaxed_dot_i8x16_i7x16_add_s(a, w, acc);
  } else {
    return i32x4.add(acc, i32x4.extadd_pairwise_i16x8_s(pairs16(a, w)));
  }
}

/** Lanes summed as (l0 + l1) + (l2 + l3): one fixed order, so results never depend on tiling. */
// @ts-ignore: decorator
@inline export function hsum(v: v128): f32 {
  return (f32x4.extract_lane(v, 0) + f32x4.extract_lane(v, 1)) +
    (f32x4.extract_lane(v, 2) + f32x4.extract_lane(v, 3));
}

// Halves are widened with integer arithmetic (a normal half's bits shifted, its exponent
// rebased), and subnormal ones through an exact multiply by 2^-24. Shifting the bits into an
// f32 subnormal and scaling that by 2^112 gives the same values, but x86 takes a microcode
// assist on every subnormal operand: the Q6_K classifier of a real 1B model ran 2.5x slower.

/** IEEE half (as its 16 bits) to f32, exact for every value (infinities and NaNs too). */
// @ts-ignore: decorator
@inline export function h2f(h: u32): f32 {
  const em = (h & 0x7fff) << 13;
  let bits: u32;
  if ((h & 0x7c00) == 0x7c00) bits = em | 0x7f800000;
  else if ((h & 0x7c00) == 0) bits = reinterpret<u32>(<f32>(h & 0x3ff) * reinterpret<f32>(0x33800000));
  else bits = em + 0x38000000;
  return reinterpret<f32>(bits | ((h & 0x8000) << 16));
}

/** h2f for a block scale: finite halves only (an infinite scale is no weight anyone stores). */
// @ts-ignore: decorator
@inline export function h2fScale(h: u32): f32 {
  const em = (h & 0x7fff) << 13;
  const bits = (h & 0x7c00) == 0
    ? reinterpret<u32>(<f32>(h & 0x3ff) * reinterpret<f32>(0x33800000))
    : em + 0x38000000;
  return reinterpret<f32>(bits | ((h & 0x8000) << 16));
}

/** 8 halves (16 bytes at p) to two f32x4, lanes 0..3 and 4..7; finite values only. */
// @ts-ignore: decorator
@inline export function h2f_lo(v: v128): v128 {
  const x = i32x4.extend_low_i16x8_u(v);
  return h2f4(x);
}
// @ts-ignore: decorator
@inline export function h2f_hi(v: v128): v128 {
  const x = i32x4.extend_high_i16x8_u(v);
  return h2f4(x);
}
// @ts-ignore: decorator
@inline export function h2f4(x: v128): v128 {
  const normal = i32x4.add(i32x4.shl(v128.and(x, vc(C_7FFF)), 13), vc(C_EXP_REBASE));
  const sub = f32x4.mul(f32x4.convert_i32x4_s(v128.and(x, vc(C_3FF))), vc(C_2M24));
  const f = v128.bitselect(sub, normal, i32x4.eq(v128.and(x, vc(C_7C00)), ZERO));
  return v128.or(f, i32x4.shl(v128.and(x, vc(C_8000)), 16));
}

/**
 * h2f4 of halves held in the high 16 bits of each i32 lane (x = h << 16). Where no lane is
 * zero or subnormal (a scale nearly always), 4 operations: the arithmetic shift right by 3
 * moves exponent and mantissa into place and copies the sign, the mask keeps the sign once,
 * and the add rebases the exponent (exactly h2f4's bits, for exponent 31 too).
 */
// @ts-ignore: decorator
@inline export function h2f4hi(x: v128): v128 {
  let f: v128;
  if (v128.any_true(i32x4.eq(v128.and(x, vc(C_EXP_HI)), ZERO))) f = h2f4(i32x4.shr_u(x, 16));
  else f = i32x4.add(v128.and(i32x4.shr_s(x, 3), vc(C_SIGN_EM)), vc(C_EXP_REBASE));
  return f;
}

/** f32 to the nearest IEEE half (ties to even), as its 16 bits. */
export function f2h(f: f32): u32 {
  let x = reinterpret<u32>(f);
  const sign = x & 0x80000000;
  x ^= sign;
  let o: u32;
  if (x >= 0x47800000) {
    o = x > 0x7f800000 ? 0x7e00 : 0x7c00;
  } else if (x < 0x38800000) {
    const g = reinterpret<f32>(x) + reinterpret<f32>(0x3f000000);
    o = reinterpret<u32>(g) - 0x3f000000;
  } else {
    const odd = (x >> 13) & 1;
    x += 0xc8000fff; // ((15 - 127) << 23) + 0xfff, wrapping
    x += odd;
    o = x >> 13;
  }
  return o | (sign >> 16);
}
