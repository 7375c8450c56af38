/**
 * The step program the worker threads run (kernels/wasm/as/program.ts reads it): a list of
 * 128-byte ops in shared memory, each followed by a barrier unless it says otherwise.
 */
import type { Matrix } from "./layer_ptrs.ts";

/** Op codes, as the AssemblyScript interpreter numbers them. */
export const OP = {
  end: 0,
  normQuant: 1,
  matmul: 2,
  qkvPost: 3,
  attention: 4,
  swiglu: 5,
  quant: 6,
  rowStats: 7,
  readSweep: 8,
} as const;

/** 32-bit words per op: an op is OP_WORDS × 4 bytes. */
export const OP_WORDS = 32;

/**
 * Query rows of one sequence the attention op computes together, sharing each K/V row read
 * (a row alone shares them across the query heads of one KV head instead).
 */
export const ATTENTION_GROUP = 4;
/** Bit of an op's word 1: the next op does not read its outputs, so no barrier follows. */
export const NO_BARRIER = 1;

const f32Scratch = new Float32Array(1);
const i32Scratch = new Int32Array(f32Scratch.buffer);
/** An f32 as the i32 word with its bits. */
export function f32Bits(x: number): number {
  f32Scratch[0] = x;
  return i32Scratch[0]!;
}

/** Writes ops into a program buffer; fields are the op's words from index 2 on. */
export class ProgramWriter {
  #n = 0;
  constructor(private readonly words: Int32Array) {}

  op(code: number, fields: readonly number[], barrier = true): this {
    const at = this.#n * OP_WORDS;
    if (at + OP_WORDS * 2 > this.words.length) {
      throw new Error(
        `Cannot add op ${code}: the program buffer holds ${this.words.length / OP_WORDS} ops`,
      );
    }
    this.words[at] = code;
    this.words[at + 1] = barrier ? 0 : NO_BARRIER;
    for (let i = 0; i < fields.length; i++) this.words[at + 2 + i] = fields[i]! | 0;
    this.#n++;
    return this;
  }

  /**
   * A matmul op: `rows` activation rows (in the quantized buffer `desc` describes) times `m`,
   * into `out` (`ostride` f32 wide), plus `bias` when non-zero, added to `out` when `accum` is 1.
   */
  matmul(
    m: Matrix,
    rows: number,
    desc: number,
    out: number,
    ostride: number,
    bias: number,
    accum: number,
    barrier = true,
  ): this {
    const fields = [m.type, m.ptr, m.rows, m.cols, desc, rows, out, ostride, bias, accum];
    return this.op(OP.matmul, fields, barrier);
  }

  /** Terminates the program; returns the number of ops. */
  end(): number {
    this.words[this.#n * OP_WORDS] = OP.end;
    return this.#n;
  }
}
