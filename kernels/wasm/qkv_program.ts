/**
 * The ops that open every layer's attention, written the same by the one-process engine
 * (wasm_engine.ts) and by a tensor-parallel rank (tp_program.ts) on its own heads.
 */
import type { EnginePart } from "./engine_part.ts";
import type { LayerPtrs } from "./layer_ptrs.ts";
import { OP, type ProgramWriter } from "./program.ts";

/** The heads one program computes and where their K and V rows go. */
export interface QkvHeads {
  readonly rows: number;
  /** The model's width (x's row). */
  readonly dim: number;
  /** Query and KV heads this program computes (all of them, or a rank's share). */
  readonly nHeads: number;
  readonly nKvHeads: number;
  readonly headDim: number;
  readonly ropeDim: number;
  /** The RMS norm's epsilon as f32 bits. */
  readonly eps: number;
  /** Where the rows' K/V cache slots are (i32 per row). */
  readonly slots: number;
  /** This layer's K and V cache. */
  readonly kc: number;
  readonly vc: number;
  readonly f32kv: number;
}

/**
 * Norms and quantizes x, multiplies it by the Q, K and V matrices into rows of Q|K|V, then
 * ropes and norms them and stores K and V in the cache (qkvPost). Returns the Q|K|V row width.
 */
export function writeQkv(w: ProgramWriter, p: EnginePart, l: LayerPtrs, h: QkvHeads): number {
  const { rows, dim, headDim } = h;
  const qDim = h.nHeads * headDim, kvDim = h.nKvHeads * headDim, qkvW = qDim + 2 * kvDim;
  w.op(OP.normQuant, [p.x, dim, rows, dim, l.attnNorm, h.eps, 0, p.actDim.desc]);
  w.matmul(l.wq, rows, p.actDim.desc, p.qkv, qkvW, l.qBias, 0, false);
  w.matmul(l.wk, rows, p.actDim.desc, p.qkv + qDim * 4, qkvW, l.kBias, 0, false);
  w.matmul(l.wv, rows, p.actDim.desc, p.qkv + (qDim + kvDim) * 4, qkvW, l.vBias, 0);
  w.op(OP.qkvPost, [
    p.qkv,
    qkvW,
    0,
    qDim,
    qDim + kvDim,
    rows,
    h.nHeads,
    h.nKvHeads,
    headDim,
    h.ropeDim,
    p.rope,
    l.qNorm,
    l.kNorm,
    h.eps,
    h.slots,
    h.kc,
    h.vc,
    h.f32kv,
  ]);
  return qkvW;
}
