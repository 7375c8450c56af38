/**
 * A tensor-parallel rank's step program, cut at its gathers: each layer is four segments, and
 * after each the ranks swap the columns they computed (tp_shard.ts). Segment ops are the
 * one-process engine's (wasm_engine.ts #writeLayers) on the rank's rows of each matrix.
 */
import type { ModelConfig } from "../../lib/model/model_config.ts";
import type { ActBuffer } from "./act_buffer.ts";
import { type EnginePart, scoreBytes, scoreRows } from "./engine_part.ts";
import type { LayerPtrs } from "./layer_ptrs.ts";
import { ATTENTION_GROUP, f32Bits, OP, type ProgramWriter } from "./program.ts";
import { writeQkv } from "./qkv_program.ts";
import type { Span, TpShard } from "./tp_shard.ts";

/** Gathers (and program segments) per layer: attention rows, residual, hidden rows, residual. */
export const TP_GATHERS_PER_LAYER = 4;

/** What a rank's segment programs address. */
export interface TpLayerContext {
  readonly config: ModelConfig;
  readonly part: EnginePart;
  readonly layer: LayerPtrs;
  readonly shard: TpShard;
  /** The rank's SwiGLU rows (its hidden columns), gathered into part.actHidden. */
  readonly hidden: ActBuffer;
  /** This layer's K and V cache (the rank's KV heads only). */
  readonly kc: number;
  readonly vc: number;
  readonly rows: number;
  readonly maxRows: number;
  readonly blockSize: number;
  readonly f32kv: number;
}

/** Where a gather lands: the full rows (`ptr`, `stride` f32 wide) and which columns are whose. */
export interface GatherTarget {
  readonly ptr: number;
  readonly stride: number;
  /** The rank's own columns, packed, come from here instead of `ptr` when set (stride: its width). */
  readonly localPtr?: number;
  readonly span: (s: TpShard) => Span;
}

/** The gather after segment `seg`. */
export function gatherTarget(seg: number, c: TpLayerContext): GatherTarget {
  const { dim, hiddenDim, nHeads, headDim } = c.config;
  const p = c.part;
  if (seg === 0) {
    const heads = (s: TpShard) => ({ start: s.heads.start * headDim, end: s.heads.end * headDim });
    return { ptr: p.actAtt.f, stride: nHeads * headDim, span: heads };
  }
  if (seg === 2) {
    return {
      ptr: p.actHidden.f,
      stride: hiddenDim,
      localPtr: c.hidden.f,
      span: (s) => s.hiddenRows,
    };
  }
  return { ptr: p.x, stride: dim, span: (s) => s.dimRows };
}

/** Writes segment `seg` (0..3) of one layer. */
export function writeTpSegment(w: ProgramWriter, seg: number, c: TpLayerContext): void {
  const { config: cfg, part: p, layer: l, shard: s, rows } = c;
  const { dim, hiddenDim, headDim } = cfg;
  const eps = f32Bits(cfg.rmsEps);
  if (seg === 0) {
    const nH = s.heads.end - s.heads.start, nKv = s.kvHeads.end - s.kvHeads.start;
    const positions = p.rowInts, slots = p.rowInts + c.maxRows * 4;
    const tableOffs = p.rowInts + 2 * c.maxRows * 4;
    const qkvW = writeQkv(w, p, l, {
      rows,
      dim,
      nHeads: nH,
      nKvHeads: nKv,
      headDim,
      ropeDim: cfg.ropeDim,
      eps,
      slots,
      kc: c.kc,
      vc: c.vc,
      f32kv: c.f32kv,
    });
    // Written into the full-width attention rows at the rank's heads: the gather fills the rest.
    w.op(OP.attention, [
      p.qkv,
      qkvW,
      0,
      p.actAtt.f + s.heads.start * headDim * 4,
      cfg.nHeads * headDim,
      rows,
      nH,
      nKv,
      headDim,
      positions,
      tableOffs,
      p.tables,
      c.blockSize,
      c.kc,
      c.vc,
      f32Bits(1 / Math.sqrt(headDim)),
      p.scores,
      scoreBytes(cfg),
      c.f32kv,
      ATTENTION_GROUP,
      scoreRows(cfg),
    ]);
  } else if (seg === 1) {
    w.op(OP.quant, [p.actAtt.desc, rows, cfg.nHeads * headDim]);
    w.matmul(l.wo, rows, p.actAtt.desc, p.x + s.dimRows.start * 4, dim, 0, 1);
  } else if (seg === 2) {
    const hl = s.hiddenRows.end - s.hiddenRows.start;
    w.op(OP.normQuant, [p.x, dim, rows, dim, l.ffnNorm, eps, 0, p.actDim.desc]);
    w.matmul(l.wGate, rows, p.actDim.desc, p.gu, 2 * hl, 0, 0, false);
    w.matmul(l.wUp, rows, p.actDim.desc, p.gu + hl * 4, 2 * hl, 0, 0);
    w.op(OP.swiglu, [p.gu, p.gu + hl * 4, 2 * hl, rows, hl, c.hidden.desc]);
  } else {
    w.op(OP.quant, [p.actHidden.desc, rows, hiddenDim]);
    w.matmul(l.wDown, rows, p.actHidden.desc, p.x + s.dimRows.start * 4, dim, 0, 1);
  }
}
