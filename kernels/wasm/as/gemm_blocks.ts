// Prefill matmuls for the 32-element 4- and 5-bit types (Q4_0, Q4_1, Q5_0, Q5_1) as a tiled
// GEMM, beside gemm.ts's K-quants: a tile of BLOCK_TILE weight rows is unpacked once into this
// thread's scratch (each block's 32 weights as bytes, its scale and its offset factor as f32),
// then every four activation rows of the step are taken against each of the tile's rows while
// those four rows' activations are still in cache. legacy.ts unpacks a weight row again for
// every four activation rows, and its Q5 fifth bits cost two table lookups a block.
//
// Each output is the same sequence of f32 operations as in legacy.ts (legacyRows4, and
// legacyOne for the rows left over): acc += f32(S_j)·(dw_j·da_j), e += m_j·s_j over the blocks
// in order, then acc + e, with S_j the same exact integer. So logits do not depend on which
// path, batch or thread computed them. gemm.ts's tile loop (gemmTiles) drives these per tile.

import { blockBytes, T_Q4_0, T_Q5_1 } from "./formats";
import {
  dot32,
  fold32,
  highHalf,
  lanesum,
  lowHalf,
  offsetOf,
  scaleAt,
  scaleOf,
} from "./legacy";
import { ACT_D32, ACT_Q32, ACT_S32 } from "./quantize";


/** Weight rows unpacked together. */
export const BLOCK_TILE: i32 = 4;

/** True for the types whose GEMM is gemm.ts's gemmQ4_0 … gemmQ5_1 (this file's unpacking and sums). */
export function blockGemmType(type: i32): bool {
  return type >= T_Q4_0 && type <= T_Q5_1;
}

/**
 * Scratch bytes of one unpacked weight row: K weight bytes (block j at 32·j), then the K/32
 * scales, then the K/32 offset factors (f32).
 */
export function blockRowScratch(K: i32): usize {
  return <usize>K + (<usize>(K >> 5) << 3);
}

/** Scratch bytes of a whole tile. */
export function blockTileScratch(K: i32): usize {
  return <usize>BLOCK_TILE * blockRowScratch(K);
}

/** Unpacks weight row wr (K wide) into the scratch row at r. */
// @ts-ignore: decorator
@inline export function unpackBlockRow(type: i32, wr: usize, K: i32, r: usize): void {
  const nb = K >> 5;
  const bb = blockBytes(type);
  const dws = r + <usize>K, offs = dws + (<usize>nb << 2);
  for (let j = 0; j < nb; j++) {
    const bp = wr + <usize>j * bb;
    const wj = r + (<usize>j << 5);
    v128.store(wj, lowHalf(type, bp));
    v128.store(wj, highHalf(type, bp), 16);
    const dw = scaleOf(bp);
    store<f32>(dws + (<usize>j << 2), dw);
    store<f32>(offs + (<usize>j << 2), offsetOf(type, bp, dw));
  }
}

/** One unpacked weight row (at r) against activation rows b..b+3: legacyRows4's lanes. */
// @ts-ignore: decorator
@inline export function rows4(r: usize, K: i32, desc: usize, b: i32): v128 {
  const nb = K >> 5;
  const qk = <usize>K;
  const ds = load<usize>(desc, ACT_D32) + (<usize>((b >> 2) * nb) << 4);
  const ss = load<usize>(desc, ACT_S32) + (<usize>((b >> 2) * nb) << 4);
  const dws = r + qk, offs = dws + (<usize>nb << 2);
  const q = load<usize>(desc, ACT_Q32) + <usize>b * qk;
  let acc = f32x4.splat(0), e = f32x4.splat(0);
  for (let j = 0; j < nb; j++) {
    const wj = r + (<usize>j << 5);
    const w0 = v128.load(wj), w1 = v128.load(wj, 16);
    const qo = q + (<usize>j << 5);
    const s = fold32(dot32(qo, w0, w1), dot32(qo + qk, w0, w1), dot32(qo + 2 * qk, w0, w1), dot32(qo + 3 * qk, w0, w1));
    const jo = <usize>j << 4;
    const dw = load<f32>(dws + (<usize>j << 2));
    acc = f32x4.add(acc, f32x4.mul(f32x4.convert_i32x4_s(s), f32x4.mul(f32x4.splat(dw), v128.load(ds + jo))));
    e = f32x4.add(e, f32x4.mul(f32x4.splat(load<f32>(offs + (<usize>j << 2))), v128.load(ss + jo)));
  }
  return f32x4.add(acc, e);
}

/** One unpacked weight row against activation row b alone: legacyOne's operations. */
// @ts-ignore: decorator
@inline export function one(r: usize, K: i32, desc: usize, b: i32): f32 {
  const nb = K >> 5;
  const d32 = load<usize>(desc, ACT_D32), s32 = load<usize>(desc, ACT_S32);
  const q = load<usize>(desc, ACT_Q32) + <usize>b * <usize>K;
  const dws = r + <usize>K, offs = dws + (<usize>nb << 2);
  let acc: f32 = 0, e: f32 = 0;
  for (let j = 0; j < nb; j++) {
    const wj = r + (<usize>j << 5);
    const s = lanesum(dot32(q + (<usize>j << 5), v128.load(wj), v128.load(wj, 16)));
    acc = acc + <f32>s * (load<f32>(dws + (<usize>j << 2)) * load<f32>(scaleAt(d32, nb, b, j)));
    e = e + load<f32>(offs + (<usize>j << 2)) * load<f32>(scaleAt(s32, nb, b, j));
  }
  return acc + e;
}
