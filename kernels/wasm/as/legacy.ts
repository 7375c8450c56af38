// Matmuls for the 32-element weight types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), which carry a float
// scale per 32 weights. Their cost is that float step, so it is taken four outputs at a time:
// the exact integer sums of four blocks are folded into one vector's lanes, then scaled and
// accumulated together. With 4+ activation rows the lanes are four rows against one weight
// row; with fewer, one row against four weight rows, so a decode step shares each activation
// block across four weight rows.
//
// Every output element is the same sequence of f32 operations whichever way it is computed
// (or alone, in legacyOne): acc += f32(S_j) × (dw_j × da_j), e += m_j × s_j over the blocks j
// in order, then acc + e. S_j is an exact integer, so the lane-folding order cannot change it.

import { C_BIT16, C_F_M16, C_F_M8, C_M4, h2f4hi, h2fScale, pairs16, vc, ZERO } from "./simd";
import { ACT_D32, ACT_Q16, ACT_Q32, ACT_S32 } from "./quantize";
import {
  blockBytes, Q4_0_D, Q4_0_QS, Q4_1_M, Q4_1_QS, Q5_0_QH, Q5_0_QS, Q5_1_M, Q5_1_QH, Q5_1_QS, Q8_0_QS,
  T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0,
} from "./formats";


// Q5's fifth bits, spread by SIMD: each weight's byte picks its qh byte, masks its bit and
// turns it into 0x10. A 256-entry table of 8-byte masks, looked up with scalar shifts and two
// lane loads per 16 weights, made Q5_0 the slowest type to decode (4.0 GB/s a thread against
// Q4_K's 7.5).
// The masks are read from memory where used (see vc in simd.ts).
/** At +0: lanes 0..7 take qh byte 0 and lanes 8..15 byte 1 (weights 0..15); at +16 bytes 2
 * and 3 (weights 16..31); at +32 lane i's bit within its byte. */
const Q5_MASKS: usize = memory.data<u8>([
  0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
  2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
  1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128,
], 16);
const SEL_LO: usize = 0;
const SEL_HI: usize = 16;

// @ts-ignore: decorator
@inline function byteSelect(v: v128, sel: v128): v128 {
  // Every index is below 16, where the relaxed and the plain swizzle agree.
  if (ASC_FEATURE_RELAXED_SIMD) return i8x16.relaxed_swizzle(v, sel);
  return i8x16.swizzle(v, sel);
}

/** 0x10 in each lane whose weight's fifth bit is set, for the qh word at p (sel: which half). */
// @ts-ignore: decorator
@inline function fifthBits(p: usize, sel: usize): v128 {
  const bitOf = v128.load(Q5_MASKS, 32);
  const bits = v128.and(byteSelect(v128.load32_splat(p), v128.load(Q5_MASKS + sel)), bitOf);
  return v128.and(i8x16.eq(bits, bitOf), vc(C_BIT16));
}

/** Weights 0..15 of a 4/5-bit block as unsigned bytes below 32. */
// @ts-ignore: decorator
@inline export function lowHalf(type: i32, bp: usize): v128 {
  return halfOf(type, bp, 0);
}

/** Weights 16..31. */
// @ts-ignore: decorator
@inline export function highHalf(type: i32, bp: usize): v128 {
  return halfOf(type, bp, 1);
}

/** Weights 16h..16h+15 of a 4/5-bit block: nibble h of each qs byte, with Q5's fifth bit. */
// @ts-ignore: decorator
@inline function halfOf(type: i32, bp: usize, h: i32): v128 {
  const x = type == T_Q4_0
    ? v128.load(bp, Q4_0_QS)
    : type == T_Q4_1
    ? v128.load(bp, Q4_1_QS)
    : type == T_Q5_0
    ? v128.load(bp, Q5_0_QS)
    : v128.load(bp, Q5_1_QS);
  const w = v128.and(h == 0 ? x : i16x8.shr_u(x, 4), vc(C_M4));
  if (type == T_Q4_0 || type == T_Q4_1) return w;
  const qh = bp + (type == T_Q5_0 ? Q5_0_QH : Q5_1_QH);
  return v128.or(w, fifthBits(qh, h == 0 ? SEL_LO : SEL_HI));
}

/** The block scale d: the first field of every 32-element format. */
// @ts-ignore: decorator
@inline export function scaleOf(bp: usize): f32 {
  return h2fScale(load<u16>(bp, Q4_0_D));
}

/** The factor of the activation block sum: −8·d, −16·d, the stored minimum, or 0 for Q8_0. */
// @ts-ignore: decorator
@inline export function offsetOf(type: i32, bp: usize, dw: f32): f32 {
  if (type == T_Q4_0) return dw * -8;
  if (type == T_Q5_0) return dw * -16;
  if (type == T_Q8_0) return 0;
  return type == T_Q4_1 ? h2fScale(load<u16>(bp, Q4_1_M)) : h2fScale(load<u16>(bp, Q5_1_M));
}

/**
 * A 4/5-bit block against 32 int8 activations at q: 4 i32 lanes summing to the exact dot
 * product. The two halves' pair sums are added in i16 (at most 2 × 2·127·31, exact) and widened
 * once: on a CPU without AVX-VNNI (this machine's Zen 4 has only the AVX-512 form, which V8
 * does not use) each dot4 is three instructions, and this measured faster (bench/cpu_matmul_bench.ts).
 */
// @ts-ignore: decorator
@inline export function dot32(q: usize, w0: v128, w1: v128): v128 {
  return i32x4.extadd_pairwise_i16x8_s(i16x8.add(pairs16(v128.load(q), w0), pairs16(v128.load(q, 16), w1)));
}

/** A Q8_0 block against 32 int16 activations at q: 4 i32 lanes summing to the exact dot product. */
// @ts-ignore: decorator
@inline function dot8(q: usize, x0: v128, x1: v128, x2: v128, x3: v128): v128 {
  return i32x4.add(
    i32x4.add(i32x4.dot_i16x8_s(v128.load(q), x0), i32x4.dot_i16x8_s(v128.load(q, 16), x1)),
    i32x4.add(i32x4.dot_i16x8_s(v128.load(q, 32), x2), i32x4.dot_i16x8_s(v128.load(q, 48), x3)),
  );
}

/** Lane r = the sum of i32 vector r's lanes. */
// @ts-ignore: decorator
@inline export function fold32(s0: v128, s1: v128, s2: v128, s3: v128): v128 {
  const t01 = i32x4.add(v128.shuffle<i32>(s0, s1, 0, 4, 1, 5), v128.shuffle<i32>(s0, s1, 2, 6, 3, 7));
  const t23 = i32x4.add(v128.shuffle<i32>(s2, s3, 0, 4, 1, 5), v128.shuffle<i32>(s2, s3, 2, 6, 3, 7));
  return i32x4.add(v128.shuffle<i32>(t01, t23, 0, 1, 4, 5), v128.shuffle<i32>(t01, t23, 2, 3, 6, 7));
}

// @ts-ignore: decorator
@inline export function lanesum(v: v128): i32 {
  return (i32x4.extract_lane(v, 0) + i32x4.extract_lane(v, 1)) +
    (i32x4.extract_lane(v, 2) + i32x4.extract_lane(v, 3));
}

/** Where activation row b's block j scale lives: rows are tiled by four, block-major. */
// @ts-ignore: decorator
@inline export function scaleAt(base: usize, nb: i32, b: i32, j: i32): usize {
  return base + (<usize>(((b >> 2) * nb + j) * 4 + (b & 3)) << 2);
}

/** One weight row against activation rows b..b+3: their four results as lanes. */
// @ts-ignore: decorator
@inline function legacyRows4(type: i32, wr: usize, K: i32, desc: usize, b: i32): v128 {
  const nb = K >> 5;
  const bb = blockBytes(type);
  const qk = <usize>K;
  const ds = load<usize>(desc, ACT_D32) + (<usize>((b >> 2) * nb) << 4);
  const ss = load<usize>(desc, ACT_S32) + (<usize>((b >> 2) * nb) << 4);
  let acc = f32x4.splat(0), e = f32x4.splat(0);
  if (type == T_Q8_0) {
    const q = load<usize>(desc, ACT_Q16) + (<usize>b * qk << 1);
    const qk2 = qk << 1;
    for (let j = 0; j < nb; j++) {
      const bp = wr + <usize>j * bb;
      const x0 = v128.load8x8_s(bp, Q8_0_QS), x1 = v128.load8x8_s(bp, Q8_0_QS + 8);
      const x2 = v128.load8x8_s(bp, Q8_0_QS + 16), x3 = v128.load8x8_s(bp, Q8_0_QS + 24);
      const qo = q + (<usize>j << 6);
      const s = fold32(
        dot8(qo, x0, x1, x2, x3),
        dot8(qo + qk2, x0, x1, x2, x3),
        dot8(qo + 2 * qk2, x0, x1, x2, x3),
        dot8(qo + 3 * qk2, x0, x1, x2, x3),
      );
      const sc = f32x4.mul(f32x4.splat(scaleOf(bp)), v128.load(ds + (<usize>j << 4)));
      acc = f32x4.add(acc, f32x4.mul(f32x4.convert_i32x4_s(s), sc));
    }
    return acc;
  }
  const q = load<usize>(desc, ACT_Q32) + <usize>b * qk;
  for (let j = 0; j < nb; j++) {
    const bp = wr + <usize>j * bb;
    const w0 = lowHalf(type, bp), w1 = highHalf(type, bp);
    const qo = q + (<usize>j << 5);
    const s = fold32(
      dot32(qo, w0, w1),
      dot32(qo + qk, w0, w1),
      dot32(qo + 2 * qk, w0, w1),
      dot32(qo + 3 * qk, w0, w1),
    );
    const dw = scaleOf(bp);
    const jo = <usize>j << 4;
    acc = f32x4.add(acc, f32x4.mul(f32x4.convert_i32x4_s(s), f32x4.mul(f32x4.splat(dw), v128.load(ds + jo))));
    e = f32x4.add(e, f32x4.mul(f32x4.splat(offsetOf(type, bp, dw)), v128.load(ss + jo)));
  }
  return f32x4.add(acc, e);
}

/**
 * Bytes of this thread's scratch for these kernels: none uses it since they read four weight
 * rows in lockstep, but it stays reserved so that builds before and after share one pool layout
 * (bench/cpu_matmul_bench.ts --compare runs an older build in this tree's pool).
 */
export const SCRATCH_BYTES: i32 = 4096;
/** This thread's scratch (globals are per thread; memory is shared, so each has its own range). */
let scratch: usize = 0;
export function setScratch(p: usize): void {
  scratch = p;
}

/** The four f16 values at p + i·rb (i = 0..3) as f32 lanes; finite values only. */
// @ts-ignore: decorator
@inline function halves4(p: usize, rb: usize): v128 {
  // Loaded into the high half of each i32 lane, where h2f4hi takes them.
  let v = v128.load16_lane(p, ZERO, 1);
  v = v128.load16_lane(p + rb, v, 3);
  v = v128.load16_lane(p + 2 * rb, v, 5);
  v = v128.load16_lane(p + 3 * rb, v, 7);
  return h2f4hi(v);
}

/** A Q5 block's qs bytes (Q5_0 or Q5_1). */
// @ts-ignore: decorator
@inline function q5qs(type: i32, bp: usize): v128 {
  return type == T_Q5_0 ? v128.load(bp, Q5_0_QS) : v128.load(bp, Q5_1_QS);
}

/** A Q5 block's qh word in every lane. */
// @ts-ignore: decorator
@inline function q5qh(type: i32, bp: usize): v128 {
  return type == T_Q5_0 ? v128.load32_splat(bp, Q5_0_QH) : v128.load32_splat(bp, Q5_1_QH);
}

/** Weights 16·hi .. 16·hi + 15 of a Q5 block from its qs bytes x and qh splat h. */
// @ts-ignore: decorator
@inline function q5half(x: v128, h: v128, hi: bool): v128 {
  const bitOf = v128.load(Q5_MASKS, 32);
  const bits = v128.and(byteSelect(h, v128.load(Q5_MASKS + (hi ? SEL_HI : SEL_LO))), bitOf);
  return v128.or(v128.and(hi ? i16x8.shr_u(x, 4) : x, vc(C_M4)), v128.and(i8x16.eq(bits, bitOf), vc(C_BIT16)));
}

// The unpacked halves are computed where used (no helper returns two vectors: a global for the
// second one became a store and a load per block, measured in the 1-row loop).

/** Block j's exact integer sum of the weight row at bp against activation row q8/q16 (lanes). */
// @ts-ignore: decorator
@inline function blockSum(type: i32, bp: usize, a0: v128, a1: v128, a2: v128, a3: v128): v128 {
  if (type == T_Q8_0) return dotRow8(bp, a0, a1, a2, a3);
  let w0: v128, w1: v128;
  if (type == T_Q5_0 || type == T_Q5_1) {
    const x = q5qs(type, bp), h = q5qh(type, bp);
    w0 = q5half(x, h, false);
    w1 = q5half(x, h, true);
  } else {
    w0 = lowHalf(type, bp);
    w1 = highHalf(type, bp);
  }
  return i32x4.extadd_pairwise_i16x8_s(i16x8.add(pairs16(a0, w0), pairs16(a1, w1)));
}

/** blockSum of a 4/5-bit block against two activation rows (a, c): a's returned, c's in S2. */
let S2: v128 = ZERO;
// @ts-ignore: decorator
@inline function blockSum2(type: i32, bp: usize, a0: v128, a1: v128, c0: v128, c1: v128): v128 {
  let w0: v128, w1: v128;
  if (type == T_Q5_0 || type == T_Q5_1) {
    const x = q5qs(type, bp), h = q5qh(type, bp);
    w0 = q5half(x, h, false);
    w1 = q5half(x, h, true);
  } else {
    w0 = lowHalf(type, bp);
    w1 = highHalf(type, bp);
  }
  S2 = i32x4.extadd_pairwise_i16x8_s(i16x8.add(pairs16(c0, w0), pairs16(c1, w1)));
  return i32x4.extadd_pairwise_i16x8_s(i16x8.add(pairs16(a0, w0), pairs16(a1, w1)));
}

/** The second activation row's lanes of legacyCols4Pair (globals are per thread). */
let PAIR: v128 = ZERO;

/**
 * legacyCols4 of a 4/5-bit type against activation rows b (returned) and b + 1 (in PAIR): each
 * block of the four weight rows is unpacked once for the two. Per output, the same operations.
 */
// @ts-ignore: decorator
@inline function legacyCols4Pair(type: i32, wr: usize, rb: usize, K: i32, desc: usize, b: i32): v128 {
  const nb = K >> 5;
  const bb = blockBytes(type);
  const d32 = load<usize>(desc, ACT_D32), s32 = load<usize>(desc, ACT_S32);
  const qa = load<usize>(desc, ACT_Q32) + <usize>b * <usize>K, qc = qa + <usize>K;
  let acc = f32x4.splat(0), e = f32x4.splat(0), acc2 = f32x4.splat(0), e2 = f32x4.splat(0);
  let p = wr;
  const dpa = scaleAt(d32, nb, b, 0), spa = scaleAt(s32, nb, b, 0);
  const dpc = scaleAt(d32, nb, b + 1, 0), spc = scaleAt(s32, nb, b + 1, 0);
  for (let j = 0; j < nb; j++) {
    const jq = <usize>j << 5;
    const a0 = v128.load(qa + jq), a1 = v128.load(qa + jq, 16);
    const c0 = v128.load(qc + jq), c1 = v128.load(qc + jq, 16);
    const s0 = blockSum2(type, p, a0, a1, c0, c1);
    const t0 = S2;
    const s1 = blockSum2(type, p + rb, a0, a1, c0, c1);
    const t1 = S2;
    const s2 = blockSum2(type, p + 2 * rb, a0, a1, c0, c1);
    const t2 = S2;
    const s3 = blockSum2(type, p + 3 * rb, a0, a1, c0, c1);
    const t3 = S2;
    const dw = halves4(p, rb);
    const m = type == T_Q4_0
      ? f32x4.mul(dw, vc(C_F_M8))
      : type == T_Q5_0
      ? f32x4.mul(dw, vc(C_F_M16))
      : halves4(p + (type == T_Q4_1 ? Q4_1_M : Q5_1_M), rb);
    const jo = <usize>j << 4;
    acc = f32x4.add(acc, f32x4.mul(f32x4.convert_i32x4_s(fold32(s0, s1, s2, s3)), f32x4.mul(dw, f32x4.splat(load<f32>(dpa + jo)))));
    e = f32x4.add(e, f32x4.mul(m, f32x4.splat(load<f32>(spa + jo))));
    acc2 = f32x4.add(acc2, f32x4.mul(f32x4.convert_i32x4_s(fold32(t0, t1, t2, t3)), f32x4.mul(dw, f32x4.splat(load<f32>(dpc + jo)))));
    e2 = f32x4.add(e2, f32x4.mul(m, f32x4.splat(load<f32>(spc + jo))));
    p += bb;
  }
  PAIR = f32x4.add(acc2, e2);
  return f32x4.add(acc, e);
}

/**
 * Weight rows wr + i·rb (i = 0..3) against activation row b: the four results as lanes. The
 * four rows are read in lockstep, block by block: each activation block is loaded once for the
 * four, and their sums stay in registers (reading each row's blocks in turn into a scratch of
 * sums was 1.3-1.9x slower). legacy() makes rb a quarter of its range of rows, so that each
 * lane streams through memory of its own: four neighbouring rows in lockstep ran at 0.64x
 * (Q8_0) and 0.76x (Q5_0) of the row-by-row kernel from DRAM, where a decode step reads them,
 * though faster from the caches (bench/cpu_matmul_bench.ts --shape q8_0:151936:896).
 */
// @ts-ignore: decorator
@inline function legacyCols4(type: i32, wr: usize, rb: usize, K: i32, desc: usize, b: i32): v128 {
  const nb = K >> 5;
  const bb = blockBytes(type);
  const d32 = load<usize>(desc, ACT_D32), s32 = load<usize>(desc, ACT_S32);
  const q8 = load<usize>(desc, ACT_Q32) + <usize>b * <usize>K;
  const q16 = load<usize>(desc, ACT_Q16) + (<usize>b * <usize>K << 1);
  let acc = f32x4.splat(0), e = f32x4.splat(0);
  let p = wr;
  const dp = scaleAt(d32, nb, b, 0), sp = scaleAt(s32, nb, b, 0);
  for (let j = 0; j < nb; j++) {
    let a0: v128, a1: v128, a2 = ZERO, a3 = ZERO;
    if (type == T_Q8_0) {
      const qo = q16 + (<usize>j << 6);
      a0 = v128.load(qo);
      a1 = v128.load(qo, 16);
      a2 = v128.load(qo, 32);
      a3 = v128.load(qo, 48);
    } else {
      const qo = q8 + (<usize>j << 5);
      a0 = v128.load(qo);
      a1 = v128.load(qo, 16);
    }
    const s = fold32(
      blockSum(type, p, a0, a1, a2, a3),
      blockSum(type, p + rb, a0, a1, a2, a3),
      blockSum(type, p + 2 * rb, a0, a1, a2, a3),
      blockSum(type, p + 3 * rb, a0, a1, a2, a3),
    );
    const dw = halves4(p, rb);
    const jo = <usize>j << 4;
    acc = f32x4.add(acc, f32x4.mul(f32x4.convert_i32x4_s(s), f32x4.mul(dw, f32x4.splat(load<f32>(dp + jo)))));
    if (type != T_Q8_0) {
      const m = type == T_Q4_0
        ? f32x4.mul(dw, vc(C_F_M8))
        : type == T_Q5_0
        ? f32x4.mul(dw, vc(C_F_M16))
        : halves4(p + (type == T_Q4_1 ? Q4_1_M : Q5_1_M), rb);
      e = f32x4.add(e, f32x4.mul(m, f32x4.splat(load<f32>(sp + jo))));
    }
    p += bb;
  }
  return type == T_Q8_0 ? acc : f32x4.add(acc, e);
}

/** A Q8_0 block at p (its 32 weights widened to i16) against int16 activations a0..a3. */
// @ts-ignore: decorator
@inline function dotRow8(p: usize, a0: v128, a1: v128, a2: v128, a3: v128): v128 {
  return i32x4.add(
    i32x4.add(i32x4.dot_i16x8_s(a0, v128.load8x8_s(p, Q8_0_QS)), i32x4.dot_i16x8_s(a1, v128.load8x8_s(p, Q8_0_QS + 8))),
    i32x4.add(i32x4.dot_i16x8_s(a2, v128.load8x8_s(p, Q8_0_QS + 16)), i32x4.dot_i16x8_s(a3, v128.load8x8_s(p, Q8_0_QS + 24))),
  );
}

/** One weight row against activation row b, with the same operations per element as above. */
// @ts-ignore: decorator
@inline function legacyOne(type: i32, wr: usize, K: i32, desc: usize, b: i32): f32 {
  const nb = K >> 5;
  const bb = blockBytes(type);
  const d32 = load<usize>(desc, ACT_D32), s32 = load<usize>(desc, ACT_S32);
  let acc: f32 = 0, e: f32 = 0;
  if (type == T_Q8_0) {
    const q = load<usize>(desc, ACT_Q16) + (<usize>b * <usize>K << 1);
    for (let j = 0; j < nb; j++) {
      const qo = q + (<usize>j << 6);
      const bp = wr + <usize>j * bb;
      const s = lanesum(dotRow8(bp, v128.load(qo), v128.load(qo, 16), v128.load(qo, 32), v128.load(qo, 48)));
      acc = acc + <f32>s * (scaleOf(bp) * load<f32>(scaleAt(d32, nb, b, j)));
    }
    return acc;
  }
  const q = load<usize>(desc, ACT_Q32) + <usize>b * <usize>K;
  for (let j = 0; j < nb; j++) {
    const bp = wr + <usize>j * bb;
    const s = lanesum(dot32(q + (<usize>j << 5), lowHalf(type, bp), highHalf(type, bp)));
    const dw = scaleOf(bp);
    acc = acc + <f32>s * (dw * load<f32>(scaleAt(d32, nb, b, j)));
    e = e + offsetOf(type, bp, dw) * load<f32>(scaleAt(s32, nb, b, j));
  }
  return acc + e;
}

/** Stores one output: v (+ bias[n]), added to what is there with accum. */
// @ts-ignore: decorator
@inline export function put(out: usize, v: f32, bias: usize, n: i32, accum: bool): void {
  let r = v;
  if (bias != 0) r = r + load<f32>(bias + (<usize>n << 2));
  if (accum) r = load<f32>(out) + r;
  store<f32>(out, r);
}

/** Stores the outputs of activation rows b..b+3 (r0..r3) for weight row n, at o, o + os, …. */
// @ts-ignore: decorator
@inline export function put4(
  o: usize, os: usize, r0: f32, r1: f32, r2: f32, r3: f32, bias: usize, n: i32, accum: bool,
): void {
  put(o, r0, bias, n, accum);
  put(o + os, r1, bias, n, accum);
  put(o + 2 * os, r2, bias, n, accum);
  put(o + 3 * os, r3, bias, n, accum);
}

/** put4 of the four lanes of v. */
// @ts-ignore: decorator
@inline export function putLanes4(o: usize, os: usize, v: v128, bias: usize, n: i32, accum: bool): void {
  put4(o, os, f32x4.extract_lane(v, 0), f32x4.extract_lane(v, 1), f32x4.extract_lane(v, 2), f32x4.extract_lane(v, 3), bias, n, accum);
}

/** The lanes of v as the outputs of weight rows n, n + q, n + 2q, n + 3q (at o, o + qo, …). */
// @ts-ignore: decorator
@inline function putQuarters4(o: usize, qo: usize, v: v128, bias: usize, n: i32, q: i32, accum: bool): void {
  put(o, f32x4.extract_lane(v, 0), bias, n, accum);
  put(o + qo, f32x4.extract_lane(v, 1), bias, n + q, accum);
  put(o + 2 * qo, f32x4.extract_lane(v, 2), bias, n + 2 * q, accum);
  put(o + 3 * qo, f32x4.extract_lane(v, 3), bias, n + 3 * q, accum);
}

// @ts-ignore: decorator
@inline function legacy(
  type: i32, w: usize, K: i32, desc: usize, B: i32, out: usize, ostride: i32, bias: usize,
  accum: bool, n0: i32, n1: i32,
): void {
  const rb = <usize>(K >> 5) * blockBytes(type);
  const os = <usize>ostride << 2;
  const B4 = B & ~3;
  if (B4 > 0) {
    for (let n = n0; n < n1; n++) {
      const wr = w + <usize>n * rb;
      const on = out + (<usize>n << 2);
      for (let b = 0; b < B4; b += 4) {
        const v = legacyRows4(type, wr, K, desc, b);
        putLanes4(on + <usize>b * os, os, v, bias, n, accum);
      }
    }
  }
  // Lane r takes rows n0 + r·q + g: each lane reads its own quarter of the range in order. Two
  // activation rows left over go together where the weights need unpacking (not Q8_0).
  const q = (n1 - n0) >> 2;
  const qs = <usize>q * rb, qo = <usize>q << 2;
  for (let b = B4; b < B;) {
    const two = type != T_Q8_0 && b + 2 <= B;
    const ob = out + <usize>b * os;
    for (let g = 0; g < q; g++) {
      const n = n0 + g;
      const o = ob + (<usize>n << 2);
      const v = two ? legacyCols4Pair(type, w + <usize>n * rb, qs, K, desc, b) : legacyCols4(type, w + <usize>n * rb, qs, K, desc, b);
      putQuarters4(o, qo, v, bias, n, q, accum);
      if (two) putQuarters4(o + os, qo, PAIR, bias, n, q, accum);
    }
    const nr = two ? 2 : 1;
    for (let n = n0 + 4 * q; n < n1; n++) {
      for (let k = 0; k < nr; k++) {
        put(ob + <usize>k * os + (<usize>n << 2), legacyOne(type, w + <usize>n * rb, K, desc, b + k), bias, n, accum);
      }
    }
    b += nr;
  }
}

// One function per type, so that each is compiled with its type's branches folded away.
export function matmulQ8_0(w: usize, K: i32, desc: usize, B: i32, out: usize, os: i32, bias: usize, accum: bool, n0: i32, n1: i32): void {
  legacy(T_Q8_0, w, K, desc, B, out, os, bias, accum, n0, n1);
}
export function matmulQ4_0(w: usize, K: i32, desc: usize, B: i32, out: usize, os: i32, bias: usize, accum: bool, n0: i32, n1: i32): void {
  legacy(T_Q4_0, w, K, desc, B, out, os, bias, accum, n0, n1);
}
export function matmulQ4_1(w: usize, K: i32, desc: usize, B: i32, out: usize, os: i32, bias: usize, accum: bool, n0: i32, n1: i32): void {
  legacy(T_Q4_1, w, K, desc, B, out, os, bias, accum, n0, n1);
}
export function matmulQ5_0(w: usize, K: i32, desc: usize, B: i32, out: usize, os: i32, bias: usize, accum: bool, n0: i32, n1: i32): void {
  legacy(T_Q5_0, w, K, desc, B, out, os, bias, accum, n0, n1);
}
export function matmulQ5_1(w: usize, K: i32, desc: usize, B: i32, out: usize, os: i32, bias: usize, accum: bool, n0: i32, n1: i32): void {
  legacy(T_Q5_1, w, K, desc, B, out, os, bias, accum, n0, n1);
}
