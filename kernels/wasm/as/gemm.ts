// Prefill matmuls for the K-quants as a tiled GEMM: a tile of GEMM_ROWS weight rows is unpacked
// once into this thread's scratch (int8 weights, i16 group scales, offset factors and the two
// float scales of each super-block), then every activation row of the step is taken against it,
// four at a time. The matmul in matmul.ts unpacks a weight row again for every four activation
// rows; here each unpacked weight is reused by all B rows, the four rows' activation block by
// the tile's weight rows, and the unpacking is out of the inner loop altogether.
//
// Every output element is the same sequence of operations as in matmul.ts's k_kquant: per
// super-block the same exact i32 lanes (the same elements meet in the same lane), the same
// f32 updates a += f32(i)·(dw·da) and e += f32(o)·(dm·da) in super-block order, then
// hsum(a) + hsum(e): both take them from kquant_dot.ts. So a row's result is bit for bit the one the 1-row path gives: logits do
// not depend on the batch, and either path may serve any step. gemm() hands the 32-element
// 4/5-bit types to gemm_blocks.ts, which does the same for legacy.ts's kernels.

import { h2fScale, hsum, ZERO } from "./simd";
import { kdot, koff, kupdate } from "./kquant_dot";
import { put, put4, putLanes4 } from "./legacy";
import { blockBytes, T_Q2_K, T_Q3_K, T_Q4_0, T_Q4_1, T_Q4_K, T_Q5_0, T_Q5_1, T_Q5_K, T_Q6_K } from "./formats";
import { ACT_BS16, ACT_BS32, ACT_D256, ACT_Q256 } from "./quantize";
import {
  BLOCK_TILE, blockGemmType, blockRowScratch, blockTileScratch, one, rows4, unpackBlockRow,
} from "./gemm_blocks";


/** Most weight rows unpacked together; their scratch is tileRows(K) × rowScratch(K). */
const GEMM_ROWS: i32 = 4;
/** Bytes of each thread's GEMM scratch (after the legacy kernels' SCRATCH_BYTES). */
export const GEMM_SCRATCH_BYTES: i32 = 128 << 10;
/** Fewer activation rows than this take matmul.ts's and legacy.ts's paths (same bits). */
export const GEMM_MIN_ROWS: i32 = 8;
/**
 * Q4_K and Q5_K take the GEMM only from this many rows: matmul.ts's 4-row tile unpacks their
 * 32-element groups cheaply. On an 8192 × 2048 and a 2048 × 8192 Q4_K, 2 threads of this
 * machine's Zen 4, the GEMM measured 0.94x and 0.91x at 16 rows, 1.05x and 1.07x at 64, 1.04x
 * and 1.22x at 256 (CPU time, alternating, median of 3).
 */
export const GEMM_MIN_ROWS_Q45K: i32 = 64;

let gscratch: usize = 0;
export function setGemmScratch(p: usize): void {
  gscratch = p;
}

const M4: v128 = i8x16.splat(0x0f);
const M30: v128 = i8x16.splat(0x30);
const BIT16: v128 = i8x16.splat(0x10);
const M3: v128 = i8x16.splat(3);
const ONE: v128 = i8x16.splat(1);

// Scratch of one weight row: K int8 weights (element order), then 16 i16 group scales per
// super-block (8 for the 32-element groups of Q4_K/Q5_K), splat into a vector as they are read,
// then 16 i16 offset factors per super-block, then (dw, dm) as f32 per super-block.
// @ts-ignore: decorator
@inline function rowScratch(K: i32): usize {
  return <usize>K + (<usize>(K >> 8) << 5) + (<usize>(K >> 8) << 5) + (<usize>(K >> 8) << 3);
}

/**
 * True where gemm() serves a matmul of this type and width over B activation rows: the
 * K-quants and the 32-element 4/5-bit types, from GEMM_MIN_ROWS rows (GEMM_MIN_ROWS_Q45K for
 * Q4_K and Q5_K), when a weight tile fits the scratch.
 */
export function gemmServes(type: i32, K: i32, B: i32): bool {
  if (B < GEMM_MIN_ROWS) return false;
  if (blockGemmType(type)) return (K & 31) == 0 && blockTileScratch(K) <= <usize>GEMM_SCRATCH_BYTES;
  if (type < T_Q2_K || type > T_Q6_K || (K & 255) != 0) return false;
  if ((type == T_Q4_K || type == T_Q5_K) && B < GEMM_MIN_ROWS_Q45K) return false;
  return tileRows(K) > 0;
}

/** K-quant weight rows per tile: GEMM_ROWS, or fewer where a row is too wide for the scratch. */
function tileRows(K: i32): i32 {
  return <i32>min(<usize>GEMM_ROWS, <usize>GEMM_SCRATCH_BYTES / rowScratch(K));
}

/** 32 weights as two vectors (elements 0..15, 16..31) at w. */
// @ts-ignore: decorator
@inline function put32(w: usize, lo: v128, hi: v128): void {
  v128.store(w, lo);
  v128.store(w, hi, 16);
}

// ---- unpacking, one super-block of one row at a time ----------------------------------------
// Each writes 256 weights at w, the group scales at s, the offset factors at o and (dw, dm) at d,
// exactly as matmul.ts's k_kquant forms them in registers.

function unpackQ45K(type: i32, bp: usize, w: usize, s: usize, o: usize, d: usize): void {
  store<f32>(d, h2fScale(load<u16>(bp)));
  store<f32>(d, -h2fScale(load<u16>(bp + 2)), 4);
  let u0 = load<u32>(bp + 4), u1 = load<u32>(bp + 8);
  const u2 = load<u32>(bp + 12);
  const u3 = ((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4);
  const mins03 = u1 & 0x3f3f3f3f;
  u1 = (u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4);
  u0 &= 0x3f3f3f3f;
  v128.store(s, i16x8.extend_low_i8x16_u(i32x4.replace_lane(i32x4.splat(<i32>u0), 1, <i32>u1)));
  v128.store(o, i16x8.extend_low_i8x16_u(i32x4.replace_lane(i32x4.splat(<i32>mins03), 1, <i32>u3)));
  const q5 = type == T_Q5_K;
  const qs = bp + (q5 ? 48 : 16);
  const h0 = q5 ? v128.load(bp + 16) : ZERO, h1 = q5 ? v128.load(bp + 32) : ZERO;
  for (let c = 0; c < 4; c++) {
    const x0 = v128.load(qs + (<usize>c << 5)), x1 = v128.load(qs + (<usize>c << 5), 16);
    let w0 = v128.and(x0, M4), w1 = v128.and(x1, M4);
    let w2 = v128.and(i16x8.shr_u(x0, 4), M4), w3 = v128.and(i16x8.shr_u(x1, 4), M4);
    if (q5) {
      // Sub-block 2c takes bit 2c of each qh byte, sub-block 2c+1 bit 2c+1, as 0x10.
      const b0 = 2 * c, b1 = 2 * c + 1;
      w0 = v128.or(w0, i8x16.shl(v128.and(i8x16.shr_u(h0, b0), ONE), 4));
      w1 = v128.or(w1, i8x16.shl(v128.and(i8x16.shr_u(h1, b0), ONE), 4));
      w2 = v128.or(w2, i8x16.shl(v128.and(i8x16.shr_u(h0, b1), ONE), 4));
      w3 = v128.or(w3, i8x16.shl(v128.and(i8x16.shr_u(h1, b1), ONE), 4));
    }
    put32(w + (<usize>c << 6), w0, w1);
    put32(w + (<usize>c << 6) + 32, w2, w3);
  }
}

function unpackQ6K(bp: usize, w: usize, s: usize, o: usize, d: usize): void {
  const dw = h2fScale(load<u16>(bp + 208));
  store<f32>(d, dw);
  store<f32>(d, dw * -32, 4);
  const scb = v128.load(bp + 192);
  const sLo = i16x8.extend_low_i8x16_s(scb), sHi = i16x8.extend_high_i8x16_s(scb);
  v128.store(s, sLo);
  v128.store(s, sHi, 16);
  v128.store(o, sLo);
  v128.store(o, sHi, 16);
  for (let h = 0; h < 2; h++) {
    const hp = bp + (<usize>h << 6), wh = w + (<usize>h << 7);
    const qh0 = v128.load(bp + 128 + (<usize>h << 5)), qh1 = v128.load(bp + 144 + (<usize>h << 5));
    const xa0 = v128.load(hp), xa1 = v128.load(hp, 16);
    const xb0 = v128.load(hp, 32), xb1 = v128.load(hp, 48);
    put32(wh, v128.or(v128.and(xa0, M4), v128.and(i16x8.shl(qh0, 4), M30)), v128.or(v128.and(xa1, M4), v128.and(i16x8.shl(qh1, 4), M30)));
    put32(wh + 32, v128.or(v128.and(xb0, M4), v128.and(i16x8.shl(qh0, 2), M30)), v128.or(v128.and(xb1, M4), v128.and(i16x8.shl(qh1, 2), M30)));
    put32(wh + 64, v128.or(v128.and(i16x8.shr_u(xa0, 4), M4), v128.and(qh0, M30)), v128.or(v128.and(i16x8.shr_u(xa1, 4), M4), v128.and(qh1, M30)));
    put32(wh + 96, v128.or(v128.and(i16x8.shr_u(xb0, 4), M4), v128.and(i16x8.shr_u(qh0, 2), M30)), v128.or(v128.and(i16x8.shr_u(xb1, 4), M4), v128.and(i16x8.shr_u(qh1, 2), M30)));
  }
}

function unpackQ3K(bp: usize, w: usize, s: usize, o: usize, d: usize): void {
  const dw = h2fScale(load<u16>(bp + 108));
  store<f32>(d, dw);
  store<f32>(d, dw * -4, 4);
  const a = load<u32>(bp + 96), bb = load<u32>(bp + 100), t = load<u32>(bp + 104);
  let packed = i32x4.splat(<i32>((a & 0x0f0f0f0f) | ((t & 0x03030303) << 4)));
  packed = i32x4.replace_lane(packed, 1, <i32>((bb & 0x0f0f0f0f) | (((t >> 2) & 0x03030303) << 4)));
  packed = i32x4.replace_lane(packed, 2, <i32>(((a >> 4) & 0x0f0f0f0f) | (((t >> 4) & 0x03030303) << 4)));
  packed = i32x4.replace_lane(packed, 3, <i32>(((bb >> 4) & 0x0f0f0f0f) | (((t >> 6) & 0x03030303) << 4)));
  const scv = i8x16.sub(packed, i8x16.splat(32));
  const sLo = i16x8.extend_low_i8x16_s(scv), sHi = i16x8.extend_high_i8x16_s(scv);
  v128.store(s, sLo);
  v128.store(s, sHi, 16);
  v128.store(o, sLo);
  v128.store(o, sHi, 16);
  const hm0 = v128.load(bp), hm1 = v128.load(bp, 16);
  for (let n = 0; n < 2; n++) {
    const x0 = v128.load(bp + 32 + (<usize>n << 5)), x1 = v128.load(bp + 32 + (<usize>n << 5), 16);
    for (let k = 0; k < 4; k++) {
      const hb = 4 * n + k;
      put32(
        w + (<usize>(128 * n + 32 * k)),
        v128.or(v128.and(i8x16.shr_u(x0, 2 * k), M3), i8x16.shl(v128.and(i8x16.shr_u(hm0, hb), ONE), 2)),
        v128.or(v128.and(i8x16.shr_u(x1, 2 * k), M3), i8x16.shl(v128.and(i8x16.shr_u(hm1, hb), ONE), 2)),
      );
    }
  }
}

function unpackQ2K(bp: usize, w: usize, s: usize, o: usize, d: usize): void {
  store<f32>(d, h2fScale(load<u16>(bp + 80)));
  store<f32>(d, -h2fScale(load<u16>(bp + 82)), 4);
  const scv = v128.load(bp);
  const sc = v128.and(scv, M4), mins = i8x16.shr_u(scv, 4);
  v128.store(s, i16x8.extend_low_i8x16_u(sc));
  v128.store(s, i16x8.extend_high_i8x16_u(sc), 16);
  v128.store(o, i16x8.extend_low_i8x16_u(mins));
  v128.store(o, i16x8.extend_high_i8x16_u(mins), 16);
  for (let n = 0; n < 2; n++) {
    const x0 = v128.load(bp + 16 + (<usize>n << 5)), x1 = v128.load(bp + 16 + (<usize>n << 5), 16);
    for (let k = 0; k < 4; k++) {
      put32(w + (<usize>(128 * n + 32 * k)), v128.and(i8x16.shr_u(x0, 2 * k), M3), v128.and(i8x16.shr_u(x1, 2 * k), M3));
    }
  }
}

/** Bytes of a super-block of a K-quant type (lib/formats, through ./formats). */
function superBytes(type: i32): usize {
  return blockBytes(type);
}

/** Unpacks weight row wr (K wide) into the scratch row at r. */
function unpackRow(type: i32, wr: usize, K: i32, r: usize): void {
  const nsb = K >> 8;
  const sb = superBytes(type);
  const s = r + <usize>K, o = s + (<usize>nsb << 5), d = o + (<usize>nsb << 5);
  for (let j = 0; j < nsb; j++) {
    const bp = wr + <usize>j * sb, wj = r + (<usize>j << 8);
    const sj = s + (<usize>j << 5), oj = o + (<usize>j << 5), dj = d + (<usize>j << 3);
    if (type == T_Q6_K) unpackQ6K(bp, wj, sj, oj, dj);
    else if (type == T_Q4_K || type == T_Q5_K) unpackQ45K(type, bp, wj, sj, oj, dj);
    else if (type == T_Q3_K) unpackQ3K(bp, wj, sj, oj, dj);
    else unpackQ2K(bp, wj, sj, oj, dj);
  }
}

// ---- the tiled loop -------------------------------------------------------------------------

// Results of one (weight row, four activation rows) tile: globals are per thread.
let R0: f32 = 0;
let R1: f32 = 0;
let R2: f32 = 0;
let R3: f32 = 0;

/**
 * The integer sums of super-block j (32 weights × `nr` rows per step, g16: 16-element groups)
 * and the a-updates, for one unpacked weight row against rows q, q+qk, … of Q8_K activations.
 */
// @ts-ignore: decorator
@inline function sumsTile(g16: bool, r: usize, K: i32, desc: usize, b: i32, nr: i32): void {
  const nsb = K >> 8;
  const s = r + <usize>K, o = s + (<usize>nsb << 5), d = o + (<usize>nsb << 5);
  const qk = <usize>K, dk = <usize>nsb << 2;
  const qo = load<usize>(desc + ACT_Q256) + <usize>b * qk;
  const ds = load<usize>(desc + ACT_D256) + <usize>b * dk;
  // Each row's block sums: bs16 (K/16 of them) for the 16-element groups, else bs32.
  const bk = g16 ? <usize>(K >> 4) << 1 : <usize>(K >> 5) << 1;
  const bs = load<usize>(desc + (g16 ? ACT_BS16 : ACT_BS32)) + <usize>b * bk;
  let a0 = f32x4.splat(0), a1 = f32x4.splat(0), a2 = f32x4.splat(0), a3 = f32x4.splat(0);
  let e0 = f32x4.splat(0), e1 = f32x4.splat(0), e2 = f32x4.splat(0), e3 = f32x4.splat(0);
  for (let j = 0; j < nsb; j++) {
    const wj = r + (<usize>j << 8), q = qo + (<usize>j << 8);
    const sj = s + (<usize>j << 5);
    let i0 = ZERO, i1 = ZERO, i2 = ZERO, i3 = ZERO;
    const q1 = q + qk, q2 = q + 2 * qk, q3 = q + 3 * qk;
    for (let t = 0; t < 8; t++) { // unrolled by kernels/wasm/build.ts (unroll.ts): constant offsets
      const w0 = v128.load(wj, 32 * t), w1 = v128.load(wj, 32 * t + 16);
      // One i16 scale per 32 weights (Q4_K, Q5_K), else one per 16: splat as they are read.
      const sa = g16 ? v128.load16_splat(sj, 4 * t) : v128.load16_splat(sj, 2 * t);
      const sb = g16 ? v128.load16_splat(sj, 4 * t + 2) : sa;
      const qt = <usize>t << 5;
      i0 = kdot(!g16, i0, q + qt, w0, w1, sa, sb);
      if (nr == 4) {
        i1 = kdot(!g16, i1, q1 + qt, w0, w1, sa, sb);
        i2 = kdot(!g16, i2, q2 + qt, w0, w1, sa, sb);
        i3 = kdot(!g16, i3, q3 + qt, w0, w1, sa, sb);
      }
    }
    const dw = load<f32>(d + (<usize>j << 3)), dm = load<f32>(d + (<usize>j << 3), 4);
    const jo = <usize>j << 2;
    const oj = o + (<usize>j << 5), bj = bs + (g16 ? <usize>j << 5 : <usize>j << 4);
    const oa = v128.load(oj), ob = g16 ? v128.load(oj, 16) : ZERO;
    let da = load<f32>(ds + jo);
    a0 = kupdate(a0, i0, dw, da);
    e0 = kupdate(e0, koff(!g16, bj, oa, ob), dm, da);
    if (nr == 4) {
      da = load<f32>(ds + dk + jo);
      a1 = kupdate(a1, i1, dw, da);
      e1 = kupdate(e1, koff(!g16, bj + bk, oa, ob), dm, da);
      da = load<f32>(ds + 2 * dk + jo);
      a2 = kupdate(a2, i2, dw, da);
      e2 = kupdate(e2, koff(!g16, bj + 2 * bk, oa, ob), dm, da);
      da = load<f32>(ds + 3 * dk + jo);
      a3 = kupdate(a3, i3, dw, da);
      e3 = kupdate(e3, koff(!g16, bj + 3 * bk, oa, ob), dm, da);
    }
  }
  R0 = hsum(a0) + hsum(e0);
  R1 = hsum(a1) + hsum(e1);
  R2 = hsum(a2) + hsum(e2);
  R3 = hsum(a3) + hsum(e3);
}

/**
 * The tile loop of both GEMMs: a tile of weight rows unpacked into the scratch, then every four
 * activation rows against each of its rows, then the rows left over one at a time. kq: the
 * K-quants (unpackRow, sumsTile; g16 for 16-element groups), else the 32-element 4/5-bit types
 * (gemm_blocks.ts). Inlined with constant kq, g16 and type, so each copy is one type's loop.
 */
// @ts-ignore: decorator
@inline function gemmTiles(
  kq: bool, g16: bool, type: i32, w: usize, K: i32, desc: usize, B: i32, out: usize,
  ostride: i32, bias: usize, accum: bool, n0: i32, n1: i32,
): void {
  const rb = <usize>(K >> (kq ? 8 : 5)) * blockBytes(type);
  const rs = kq ? rowScratch(K) : blockRowScratch(K);
  const tr = kq ? tileRows(K) : BLOCK_TILE;
  const scratch = gscratch;
  const os = <usize>ostride << 2;
  const B4 = B & ~3;
  for (let t = n0; t < n1; t += tr) {
    const nt = min(tr, n1 - t);
    for (let i = 0; i < nt; i++) {
      const wr = w + <usize>(t + i) * rb, r = scratch + <usize>i * rs;
      if (kq) unpackRow(type, wr, K, r);
      else unpackBlockRow(type, wr, K, r);
    }
    for (let b = 0; b < B4; b += 4) {
      for (let i = 0; i < nt; i++) {
        const n = t + i;
        const on = out + (<usize>n << 2) + <usize>b * os, r = scratch + <usize>i * rs;
        if (kq) {
          sumsTile(g16, r, K, desc, b, 4);
          put4(on, os, R0, R1, R2, R3, bias, n, accum);
        } else {
          putLanes4(on, os, rows4(r, K, desc, b), bias, n, accum);
        }
      }
    }
    for (let b = B4; b < B; b++) {
      for (let i = 0; i < nt; i++) {
        const n = t + i;
        const r = scratch + <usize>i * rs;
        let v: f32;
        if (kq) {
          sumsTile(g16, r, K, desc, b, 1);
          v = R0;
        } else {
          v = one(r, K, desc, b);
        }
        put(out + (<usize>n << 2) + <usize>b * os, v, bias, n, accum);
      }
    }
  }
}

// The 32-element 4/5-bit types' GEMMs, one function per type (as matmul.ts's matmulQ2_K ...):
// each has its type's branches folded away and no other type's code to share registers with.
function gemmQ4_0(w: usize, K: i32, desc: usize, B: i32, out: usize, os: i32, bias: usize, accum: bool, n0: i32, n1: i32): void {
  gemmTiles(false, false, T_Q4_0, w, K, desc, B, out, os, bias, accum, n0, n1);
}
function gemmQ4_1(w: usize, K: i32, desc: usize, B: i32, out: usize, os: i32, bias: usize, accum: bool, n0: i32, n1: i32): void {
  gemmTiles(false, false, T_Q4_1, w, K, desc, B, out, os, bias, accum, n0, n1);
}
function gemmQ5_0(w: usize, K: i32, desc: usize, B: i32, out: usize, os: i32, bias: usize, accum: bool, n0: i32, n1: i32): void {
  gemmTiles(false, false, T_Q5_0, w, K, desc, B, out, os, bias, accum, n0, n1);
}
function gemmQ5_1(w: usize, K: i32, desc: usize, B: i32, out: usize, os: i32, bias: usize, accum: bool, n0: i32, n1: i32): void {
  gemmTiles(false, false, T_Q5_1, w, K, desc, B, out, os, bias, accum, n0, n1);
}

/**
 * out[b·ostride + n] (=, or += with accum) W[n]·act[b] (+ bias[n]) for weight rows n0..n1 and
 * activation rows 0..B, where gemmServes(type, K, B).
 */
export function gemm(
  type: i32, w: usize, K: i32, desc: usize, B: i32, out: usize, ostride: i32, bias: usize,
  accum: bool, n0: i32, n1: i32,
): void {
  if (type == T_Q5_0) gemmQ5_0(w, K, desc, B, out, ostride, bias, accum, n0, n1);
  else if (type == T_Q4_0) gemmQ4_0(w, K, desc, B, out, ostride, bias, accum, n0, n1);
  else if (type == T_Q4_1) gemmQ4_1(w, K, desc, B, out, ostride, bias, accum, n0, n1);
  else if (type == T_Q5_1) gemmQ5_1(w, K, desc, B, out, ostride, bias, accum, n0, n1);
  else if (type == T_Q4_K || type == T_Q5_K) gemmTiles(true, false, type, w, K, desc, B, out, ostride, bias, accum, n0, n1);
  else gemmTiles(true, true, type, w, K, desc, B, out, ostride, bias, accum, n0, n1);
}
