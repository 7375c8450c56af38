// Activations quantized to 8 bits, as llama.cpp does before its integer dot products: Q8_0
// blocks of 32 (for the 32-element weight types) and Q8_K blocks of 256 (for the K-quants).

import { hsum } from "./simd";

/**
 * Where one buffer of activation rows lives (9 pointers, written by kernels/wasm/act_buffer.ts).
 * Row r of a K-wide buffer starts at r*K in f, q32, q256 and q16 (q32 widened to i16), r*K/256
 * in d256, r*K/16 in bs16, r*K/32 in bs32 (bs16 summed in pairs; both i16). d32 and s32 are
 * tiled by four rows, block-major: row r's block j is float ((r/4)·(K/32) + j)·4 + r%4, so one
 * load gives a block's scales for four rows.
 */
export const ACT_F: i32 = 0;
export const ACT_Q32: i32 = 4;
export const ACT_D32: i32 = 8;
export const ACT_S32: i32 = 12;
export const ACT_Q256: i32 = 16;
export const ACT_D256: i32 = 20;
export const ACT_BS16: i32 = 24;
export const ACT_BS32: i32 = 28;
export const ACT_Q16: i32 = 32;

/** Largest |x| over n floats at p (n a multiple of 16). */
function absmax(p: usize, n: i32): f32 {
  let m = f32x4.splat(0);
  for (let i = 0; i < n; i += 16) {
    m = f32x4.max(m, f32x4.abs(v128.load(p + (<usize>i << 2))));
    m = f32x4.max(m, f32x4.abs(v128.load(p + (<usize>i << 2), 16)));
    m = f32x4.max(m, f32x4.abs(v128.load(p + (<usize>i << 2), 32)));
    m = f32x4.max(m, f32x4.abs(v128.load(p + (<usize>i << 2), 48)));
  }
  return max(max(f32x4.extract_lane(m, 0), f32x4.extract_lane(m, 1)), max(f32x4.extract_lane(m, 2), f32x4.extract_lane(m, 3)));
}

/**
 * 16 floats at p times id, rounded to nearest (ties to even), stored as 16 int8 at q (and as
 * 16 int16 at w unless w is 0); returns their integer sum.
 */
// @ts-ignore: decorator
@inline function q16(p: usize, id: f32, q: usize, w: usize = 0): i32 {
  const s = f32x4.splat(id);
  const a = i32x4.trunc_sat_f32x4_s(f32x4.nearest(f32x4.mul(v128.load(p), s)));
  const b = i32x4.trunc_sat_f32x4_s(f32x4.nearest(f32x4.mul(v128.load(p, 16), s)));
  const c = i32x4.trunc_sat_f32x4_s(f32x4.nearest(f32x4.mul(v128.load(p, 32), s)));
  const d = i32x4.trunc_sat_f32x4_s(f32x4.nearest(f32x4.mul(v128.load(p, 48), s)));
  const ab = i16x8.narrow_i32x4_s(a, b), cd = i16x8.narrow_i32x4_s(c, d);
  v128.store(q, i8x16.narrow_i16x8_s(ab, cd));
  if (w != 0) {
    v128.store(w, ab);
    v128.store(w, cd, 16);
  }
  const t = i32x4.add(i32x4.add(a, b), i32x4.add(c, d));
  return (i32x4.extract_lane(t, 0) + i32x4.extract_lane(t, 1)) +
    (i32x4.extract_lane(t, 2) + i32x4.extract_lane(t, 3));
}

/** Quantizes row `row` of a K-wide buffer whose f32 values are already in place. */
export function quantizeRow(desc: usize, K: i32, row: i32): void {
  if (K & 31) return; // only float weights read rows this narrow
  const f = load<usize>(desc + ACT_F) + (<usize>row * <usize>K << 2);
  const q32 = load<usize>(desc + ACT_Q32) + <usize>row * <usize>K;
  const q16w = load<usize>(desc + ACT_Q16) + (<usize>row * <usize>K << 1);
  const nb = K >> 5;
  const tile = (<usize>((row >> 2) * nb * 4 + (row & 3)) << 2);
  const d32 = load<usize>(desc + ACT_D32) + tile;
  const s32 = load<usize>(desc + ACT_S32) + tile;
  for (let j = 0; j < nb; j++) {
    const p = f + (<usize>j << 7);
    const amax = absmax(p, 32);
    const d: f32 = amax / 127;
    const id: f32 = amax > 0 ? <f32>127 / amax : 0;
    const qj = q32 + (<usize>j << 5), wj = q16w + (<usize>j << 6);
    const sum = q16(p, id, qj, wj) + q16(p + 64, id, qj + 16, wj + 32);
    store<f32>(d32 + (<usize>j << 4), d);
    store<f32>(s32 + (<usize>j << 4), d * <f32>sum);
  }
  if (K & 255) return;
  const q256 = load<usize>(desc + ACT_Q256) + <usize>row * <usize>K;
  const d256 = load<usize>(desc + ACT_D256) + (<usize>row * <usize>(K >> 8) << 2);
  const bs16 = load<usize>(desc + ACT_BS16) + (<usize>row * <usize>(K >> 4) << 1);
  const bs32 = load<usize>(desc + ACT_BS32) + (<usize>row * <usize>(K >> 5) << 1);
  for (let j = 0; j < K >> 8; j++) {
    const p = f + (<usize>j << 10);
    const amax = absmax(p, 256);
    const id: f32 = amax > 0 ? <f32>127 / amax : 0;
    store<f32>(d256 + (<usize>j << 2), amax / 127);
    for (let g = 0; g < 16; g += 2) {
      const q = q256 + (<usize>j << 8) + (<usize>g << 4);
      const s0 = q16(p + (<usize>g << 6), id, q);
      const s1 = q16(p + (<usize>g << 6) + 64, id, q + 16);
      // 16-bit: a block sum is at most 32 × 127.
      store<i16>(bs16 + (<usize>(j * 16 + g) << 1), <i16>s0);
      store<i16>(bs16 + (<usize>(j * 16 + g + 1) << 1), <i16>s1);
      store<i16>(bs32 + (<usize>(j * 8 + (g >> 1)) << 1), <i16>(s0 + s1));
    }
  }
}

/** RMSNorm of row `src` (sum of squares in 4 f32 lanes, fixed order) times w, into the buffer. */
export function normRow(x: usize, w: usize, K: i32, eps: f32, out: usize): void {
  const K4 = K & ~3;
  let ss = f32x4.splat(0);
  for (let i = 0; i < K4; i += 4) {
    const v = v128.load(x + (<usize>i << 2));
    ss = f32x4.add(ss, f32x4.mul(v, v));
  }
  let tot = hsum(ss);
  for (let i = K4; i < K; i++) {
    const v = load<f32>(x + (<usize>i << 2));
    tot += v * v;
  }
  const scale: f32 = <f32>1 / Mathf.sqrt(tot / <f32>K + eps);
  const sv = f32x4.splat(scale);
  for (let i = 0; i < K4; i += 4) {
    const o = <usize>i << 2;
    const y = f32x4.mul(sv, v128.load(x + o));
    v128.store(out + o, w == 0 ? y : f32x4.mul(v128.load(w + o), y));
  }
  for (let i = K4; i < K; i++) {
    const o = <usize>i << 2;
    const y = scale * load<f32>(x + o);
    store<f32>(out + o, w == 0 ? y : load<f32>(w + o) * y);
  }
}
