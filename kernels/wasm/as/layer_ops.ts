// The per-row steps around the matmuls: RoPE with per-head RMSNorm and the KV-cache write,
// paged attention, and SwiGLU. Every row (and every head of a row) is computed alone, so its
// result never depends on which rows share the step.

import { f2h, h2f_hi, h2f_lo, hsum } from "./simd";
import { ACT_F, normRow, quantizeRow } from "./quantize";

/** q and k of one row: optional per-head RMSNorm, RoPE from the row's (cos, sin) table, then K/V into the cache. */
export function qkvPost(
  row: usize, qOff: i32, kOff: i32, vOff: i32, nHeads: i32, nKv: i32, hd: i32, ropeDim: i32,
  rope: usize, qnorm: usize, knorm: usize, eps: f32, slot: i32, kc: usize, vc: usize, f32kv: bool,
): void {
  const q = row + (<usize>qOff << 2);
  const k = row + (<usize>kOff << 2);
  const v = row + (<usize>vOff << 2);
  const hb = <usize>hd << 2;
  if (qnorm != 0) for (let h = 0; h < nHeads; h++) normRow(q + <usize>h * hb, qnorm, hd, eps, q + <usize>h * hb);
  if (knorm != 0) for (let h = 0; h < nKv; h++) normRow(k + <usize>h * hb, knorm, hd, eps, k + <usize>h * hb);
  rotate(q, nHeads, hd, ropeDim, rope);
  rotate(k, nKv, hd, ropeDim, rope);
  const kvDim = nKv * hd;
  if (f32kv) {
    memory.copy(kc + (<usize>slot * <usize>kvDim << 2), k, <usize>kvDim << 2);
    memory.copy(vc + (<usize>slot * <usize>kvDim << 2), v, <usize>kvDim << 2);
  } else {
    const ko = kc + (<usize>slot * <usize>kvDim << 1);
    const vo = vc + (<usize>slot * <usize>kvDim << 1);
    for (let i = 0; i < kvDim; i++) {
      store<u16>(ko + (<usize>i << 1), <u16>f2h(load<f32>(k + (<usize>i << 2))));
      store<u16>(vo + (<usize>i << 1), <u16>f2h(load<f32>(v + (<usize>i << 2))));
    }
  }
}

function rotate(x: usize, heads: i32, hd: i32, ropeDim: i32, rope: usize): void {
  for (let h = 0; h < heads; h++) {
    const p = x + (<usize>(h * hd) << 2);
    for (let i = 0; i < ropeDim >> 1; i++) {
      const c = load<f32>(rope + (<usize>i << 3));
      const s = load<f32>(rope + (<usize>i << 3) + 4);
      const a = load<f32>(p + (<usize>i << 3));
      const b = load<f32>(p + (<usize>i << 3) + 4);
      store<f32>(p + (<usize>i << 3), a * c - b * s);
      store<f32>(p + (<usize>i << 3) + 4, a * s + b * c);
    }
  }
}

// @ts-ignore: decorator
@inline function kv8(p: usize, f32kv: bool, hi: bool): v128 {
  if (f32kv) return v128.load(p + (hi ? 16 : 0));
  const v = v128.load(p);
  return hi ? h2f_hi(v) : h2f_lo(v);
}

/**
 * Causal attention of nq queries that read the same K/V rows, through the block table: scores
 * q·k × scale, softmax in f32 (max subtracted), then Σ p_t v_t into out. Either one head of
 * nq rows of one sequence at consecutive positions (pstep 1: flash-style blocking over a
 * prompt's rows), or the nq heads of one row that share a KV head (pstep 0: grouped-query
 * attention at decode). Query j sits at position pos0 + j·pstep; its row is q + j·qStride, its
 * output out + j·oStride, its scores scores + j·sStride. Each K and V row is read and widened
 * once for all nq queries; every query keeps the operations and order it has alone, so its
 * result is the same bits however it is grouped. hd is a multiple of 8.
 */
export function attendHeads(
  q: usize, qStride: usize, out: usize, oStride: usize, nq: i32, pos0: i32, pstep: i32, table: usize,
  bs: i32, kc: usize, vc: usize, kvStride: i32, hd: i32, scale: f32, scores: usize, sStride: usize,
  f32kv: bool,
): void {
  const elt: usize = f32kv ? 4 : 2;
  const last = pos0 + (nq - 1) * pstep;
  for (let t = 0; t <= last; t++) {
    const slot = load<i32>(table + (<usize>(t / bs) << 2)) * bs + t % bs;
    const kp = kc + <usize>slot * <usize>kvStride * elt;
    // Queries before j0 do not see position t (causal): t > pos0 + j for j < t - pos0.
    const j0 = pstep == 0 ? 0 : max(0, t - pos0);
    for (let j = j0; j < nq; j++) {
      const qj = q + <usize>j * qStride;
      let acc = f32x4.splat(0);
      for (let i = 0; i < hd; i += 8) {
        const ki = kp + <usize>i * elt;
        const qi = qj + (<usize>i << 2);
        acc = f32x4.add(acc, f32x4.mul(v128.load(qi), kv8(ki, f32kv, false)));
        acc = f32x4.add(acc, f32x4.mul(v128.load(qi, 16), kv8(ki, f32kv, true)));
      }
      store<f32>(scores + <usize>j * sStride + (<usize>t << 2), hsum(acc) * scale);
    }
  }
  for (let j = 0; j < nq; j++) {
    const sj = scores + <usize>j * sStride;
    const pos = pos0 + j * pstep;
    let mx: f32 = -Infinity;
    for (let t = 0; t <= pos; t++) {
      const s = load<f32>(sj + (<usize>t << 2));
      if (s > mx) mx = s;
    }
    let sum: f32 = 0;
    for (let t = 0; t <= pos; t++) {
      const e = Mathf.exp(load<f32>(sj + (<usize>t << 2)) - mx);
      store<f32>(sj + (<usize>t << 2), e);
      sum += e;
    }
    const inv: f32 = <f32>1 / sum;
    // The weights p_t, scaled once here as the single-row loop scales them as it goes.
    for (let t = 0; t <= pos; t++) store<f32>(sj + (<usize>t << 2), load<f32>(sj + (<usize>t << 2)) * inv);
    const oj = out + <usize>j * oStride;
    for (let i = 0; i < hd; i += 4) v128.store(oj + (<usize>i << 2), f32x4.splat(0));
  }
  for (let t = 0; t <= last; t++) {
    const slot = load<i32>(table + (<usize>(t / bs) << 2)) * bs + t % bs;
    const vp = vc + <usize>slot * <usize>kvStride * elt;
    const j0 = pstep == 0 ? 0 : max(0, t - pos0);
    for (let i = 0; i < hd; i += 8) {
      const vi = vp + <usize>i * elt;
      const v0 = kv8(vi, f32kv, false), v1 = kv8(vi, f32kv, true);
      for (let j = j0; j < nq; j++) {
        const pv = f32x4.splat(load<f32>(scores + <usize>j * sStride + (<usize>t << 2)));
        const o = out + <usize>j * oStride + (<usize>i << 2);
        v128.store(o, f32x4.add(v128.load(o), f32x4.mul(pv, v0)));
        v128.store(o, f32x4.add(v128.load(o, 16), f32x4.mul(pv, v1)), 16);
      }
    }
  }
}

/** silu(gate) × up for one row, into the activation buffer's row, then quantized. */
export function swigluRow(g: usize, u: usize, hidden: i32, desc: usize, row: i32): void {
  const f = load<usize>(desc + ACT_F) + (<usize>row * <usize>hidden << 2);
  for (let i = 0; i < hidden; i++) {
    const o = <usize>i << 2;
    const x = load<f32>(g + o);
    store<f32>(f + o, x / (<f32>1 + Mathf.exp(-x)) * load<f32>(u + o));
  }
  quantizeRow(desc, hidden, row);
}
