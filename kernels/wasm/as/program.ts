// The entry point every worker thread runs: a step is a program of ops in shared memory,
// executed by all threads together, each taking its share of every op's rows, with a barrier
// after each op unless the op says its outputs are not read by the next one.

import { ACT_F, normRow, quantizeRow } from "./quantize";
import { matmul } from "./matmul";
import { SCRATCH_BYTES, setScratch } from "./legacy";
import { GEMM_SCRATCH_BYTES, setGemmScratch } from "./gemm";
import { attendHeads, qkvPost, swigluRow } from "./layer_ops";
import { rowStats } from "./row_stats";
import { readSweep } from "./read_sweep";
// Op codes, the op size and its flags, generated from kernels/wasm/program.ts (which writes the
// programs).
import {
  NO_BARRIER, OP_ATTENTION, OP_BYTES, OP_END, OP_MATMUL, OP_NORM_QUANT, OP_QKV_POST, OP_QUANT,
  OP_READ_SWEEP, OP_ROW_STATS, OP_SWIGLU,
} from "./ops";

const SPIN: i32 = 20000;

// @ts-ignore: decorator
@inline function word(p: usize, i: i32): i32 {
  return load<i32>(p + (<usize>i << 2));
}
// @ts-ignore: decorator
@inline function ptr(p: usize, i: i32): usize {
  return <usize>load<u32>(p + (<usize>i << 2));
}
// @ts-ignore: decorator
@inline function lo(total: i32, t: i32, n: i32): i32 {
  return <i32>((<i64>total * <i64>t) / <i64>n);
}

function barrier(ctrl: usize, n: i32): void {
  if (n == 1) return;
  const gen = atomic.load<i32>(ctrl, 4);
  if (atomic.add<i32>(ctrl, 1) == n - 1) {
    atomic.store<i32>(ctrl, 0);
    atomic.add<i32>(ctrl, 1, 4);
    atomic.notify(ctrl + 4);
    return;
  }
  for (let i = 0; i < SPIN; i++) if (atomic.load<i32>(ctrl, 4) != gen) return;
  while (atomic.load<i32>(ctrl, 4) == gen) atomic.wait<i32>(ctrl + 4, gen, -1);
}

/**
 * The attention op: work items are (group of `group` rows, KV head), split over the threads. In
 * a group, a run of rows of one sequence at consecutive positions is attended per query head
 * with the rows together (a prompt); a row alone has the query heads of its KV head together
 * (a decode). Which queries share a call never changes a query's result.
 */
function attention(p: usize, tid: i32, nth: i32): void {
  const rows = word(p, 7), nHeads = word(p, 8), nKv = word(p, 9), hd = word(p, 10);
  const stride = <usize>word(p, 3) << 2, ostride = <usize>word(p, 6) << 2;
  const group = word(p, 21);
  const headsPerKv = nHeads / nKv;
  const perThread = <usize>word(p, 19);
  const scores = ptr(p, 18) + <usize>tid * perThread;
  const sStride = perThread / <usize>word(p, 22);
  const positions = ptr(p, 11), tableOffs = ptr(p, 12);
  const f32kv = word(p, 20) != 0;
  const hb = <usize>hd << 2;
  const total = ((rows + group - 1) / group) * nKv;
  for (let i = lo(total, tid, nth); i < lo(total, tid + 1, nth); i++) {
    const g = i % nKv, r1 = min(rows, (i / nKv) * group + group);
    const kvOff = <usize>g * <usize>hd * (f32kv ? 4 : 2);
    const kc = ptr(p, 15) + kvOff, vc = ptr(p, 16) + kvOff;
    for (let r = (i / nKv) * group; r < r1;) {
      const pos0 = load<i32>(positions + (<usize>r << 2)), toff = load<i32>(tableOffs + (<usize>r << 2));
      const table = ptr(p, 13) + (<usize>toff << 2);
      let n = 1;
      while (
        r + n < r1 && load<i32>(tableOffs + (<usize>(r + n) << 2)) == toff &&
        load<i32>(positions + (<usize>(r + n) << 2)) == pos0 + n
      ) n++;
      const q = ptr(p, 2) + <usize>r * stride + (<usize>(word(p, 4) + g * headsPerKv * hd) << 2);
      const out = ptr(p, 5) + <usize>r * ostride + <usize>(g * headsPerKv) * hb;
      if (n == 1) {
        attendHeads(
          q, hb, out, hb, headsPerKv, pos0, 0, table, word(p, 14), kc, vc, nKv * hd, hd,
          reinterpret<f32>(word(p, 17)), scores, sStride, f32kv,
        );
      } else {
        for (let h = 0; h < headsPerKv; h++) {
          attendHeads(
            q + <usize>h * hb, stride, out + <usize>h * hb, ostride, n, pos0, 1, table, word(p, 14), kc, vc,
            nKv * hd, hd, reinterpret<f32>(word(p, 17)), scores, sStride, f32kv,
          );
        }
      }
      r += n;
    }
  }
}

/** Bytes of the scratch range each thread's run() is given. */
export function scratchBytes(): i32 {
  return SCRATCH_BYTES + GEMM_SCRATCH_BYTES;
}

/**
 * Runs the program at prog as thread tid of nth; ctrl is the barrier's two words, scratch this
 * thread's own scratchBytes(): the legacy kernels' SCRATCH_BYTES, then the GEMM's.
 */
export function run(prog: usize, ctrl: usize, tid: i32, nth: i32, scratch: usize): void {
  setScratch(scratch);
  setGemmScratch(scratch + <usize>SCRATCH_BYTES);
  for (let p = prog; ; p += OP_BYTES) {
    const op = word(p, 0);
    if (op == OP_END) break;
    if (op == OP_NORM_QUANT) {
      const rows = word(p, 4), K = word(p, 5), desc = ptr(p, 9), map = ptr(p, 8);
      const f = ptr(desc, ACT_F / 4);
      for (let r = lo(rows, tid, nth); r < lo(rows, tid + 1, nth); r++) {
        const src = map == 0 ? r : load<i32>(map + (<usize>r << 2));
        const x = ptr(p, 2) + (<usize>src * <usize>word(p, 3) << 2);
        normRow(x, ptr(p, 6), K, reinterpret<f32>(word(p, 7)), f + (<usize>r * <usize>K << 2));
        quantizeRow(desc, K, r);
      }
    } else if (op == OP_QUANT) {
      const rows = word(p, 3);
      for (let r = lo(rows, tid, nth); r < lo(rows, tid + 1, nth); r++) quantizeRow(ptr(p, 2), word(p, 4), r);
    } else if (op == OP_MATMUL) {
      const N = word(p, 4);
      matmul(
        word(p, 2), ptr(p, 3), word(p, 5), ptr(p, 6), word(p, 7), ptr(p, 8), word(p, 9),
        ptr(p, 10), word(p, 11) != 0, lo(N, tid, nth), lo(N, tid + 1, nth),
      );
    } else if (op == OP_QKV_POST) {
      const rows = word(p, 7), stride = <usize>word(p, 3) << 2;
      const ropeBytes = <usize>(word(p, 11) >> 1) << 3;
      for (let r = lo(rows, tid, nth); r < lo(rows, tid + 1, nth); r++) {
        qkvPost(
          ptr(p, 2) + <usize>r * stride, word(p, 4), word(p, 5), word(p, 6), word(p, 8),
          word(p, 9), word(p, 10), word(p, 11), ptr(p, 12) + <usize>r * ropeBytes, ptr(p, 13),
          ptr(p, 14), reinterpret<f32>(word(p, 15)), load<i32>(ptr(p, 16) + (<usize>r << 2)),
          ptr(p, 17), ptr(p, 18), word(p, 19) != 0,
        );
      }
    } else if (op == OP_ATTENTION) {
      attention(p, tid, nth);
    } else if (op == OP_SWIGLU) {
      const rows = word(p, 5), stride = <usize>word(p, 4) << 2;
      for (let r = lo(rows, tid, nth); r < lo(rows, tid + 1, nth); r++) {
        swigluRow(ptr(p, 2) + <usize>r * stride, ptr(p, 3) + <usize>r * stride, word(p, 6), ptr(p, 7), r);
      }
    } else if (op == OP_ROW_STATS) {
      // Fields: logits, rows, vocabulary, out (16 bytes a row).
      const rows = word(p, 3), V = word(p, 4);
      for (let r = lo(rows, tid, nth); r < lo(rows, tid + 1, nth); r++) {
        rowStats(ptr(p, 2) + (<usize>r * <usize>V << 2), V, ptr(p, 5) + (<usize>r << 4));
      }
    } else if (op == OP_READ_SWEEP) {
      // Fields: base, 64-byte units, sink (16 bytes a thread).
      const units = word(p, 3);
      const u0 = lo(units, tid, nth), u1 = lo(units, tid + 1, nth);
      readSweep(ptr(p, 2) + (<usize>u0 << 6), <usize>(u1 - u0) << 6, ptr(p, 4) + (<usize>tid << 4));
    } else {
      unreachable();
    }
    if ((word(p, 1) & NO_BARRIER) == 0) barrier(ctrl, nth);
  }
}
