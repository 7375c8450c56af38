// The K-quants' integer sums and their f32 update, shared by matmul.ts's k_kquant (a weight row
// unpacked in registers) and gemm.ts's sumsTile (unpacked once into scratch): a row's result
// is bit for bit the same on either path only while both take these operations in this order.
//
// Pair sums are in i16 (a sub-block's sums stay within i16 for weights below 64), widened or
// scaled by pmaddwd into i32 lanes.

import { pairs16 } from "./simd";

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

/**
 * is + a 32-element sub-block's Σ sc·w·a at activations q: one scale sa for its 32 elements
 * (per32: Q4_K, Q5_K) or sa, sb for its two halves (Q2_K, Q3_K, Q6_K).
 */
// @ts-ignore: decorator
@inline export function kdot(per32: bool, is: v128, q: usize, w0: v128, w1: v128, sa: v128, sb: v128): v128 {
  return per32 ? kacc32(is, q, w0, w1, sa) : kacc16(is, q, w0, w1, sa, sb);
}

/**
 * Σ offset_g × (block sum g) over a super-block as i32 lanes, from the 16-bit block sums at bo:
 * per 32 elements (8 i16 offsets in a) or per 16 (16 in a, b).
 */
// @ts-ignore: decorator
@inline export function koff(per32: bool, bo: usize, a: v128, b: v128): v128 {
  if (per32) return i32x4.dot_i16x8_s(a, v128.load(bo));
  return i32x4.add(i32x4.dot_i16x8_s(a, v128.load(bo)), i32x4.dot_i16x8_s(b, v128.load(bo, 16)));
}

/** acc + f32(sums)·(d·da) lane by lane: a super-block's update of one row's accumulator. */
// @ts-ignore: decorator
@inline export function kupdate(acc: v128, sums: v128, d: f32, da: f32): v128 {
  return f32x4.add(acc, f32x4.mul(f32x4.convert_i32x4_s(sums), f32x4.splat(d * da)));
}
