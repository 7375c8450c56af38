/**
 * What every weight format states once: how many elements a block holds, its bytes, where each
 * field sits in it, and its reference decode. The readers (lib/model, the WGSL in
 * kernels/webgpu/weight_formats.ts, the AssemblyScript kernels through the constants
 * kernels/wasm/build.ts generates) take their offsets from here, as ggml's kernels take theirs
 * from ggml-common.h.
 */
import { halves } from "./half.ts";

/** A field of a block: its byte offset and its length in bytes. */
export interface Field {
  readonly at: number;
  readonly bytes: number;
}

/**
 * Decodes `blocks` consecutive blocks from `u` (from byte `at`) into `out` (from element `o`).
 * Every formula follows ggml's reference dequantization (ggml-quants.c); each product of a
 * scale and a quant is exact in f32, so computing in f64 and storing to f32 rounds once, as
 * ggml's f32 arithmetic does.
 */
export type BlockDecoder = (
  u: Uint8Array,
  at: number,
  out: Float32Array,
  o: number,
  blocks: number,
) => void;

/** Decodes the one block at `u[at]` into `out[o]` on; `h` is the f16 table (halves()). */
export type OneBlock = (
  u: Uint8Array,
  at: number,
  out: Float32Array,
  o: number,
  h: Float32Array,
) => void;

export interface BlockFormat<T extends string = string, F extends string = string> {
  /** Our name, as models and errors spell it: "q6_k". */
  readonly type: T;
  /** ggml's name ("Q6_K") and its number in ggml.h's enum ggml_type. */
  readonly ggmlName: string;
  readonly ggmlType: number;
  /** Elements per block: 1 for the float types, 32 for the legacy quants, 256 for the K-quants. */
  readonly elements: number;
  /** Bytes per block: the fields' lengths summed. */
  readonly bytes: number;
  /** The fields in block order. */
  readonly fields: Readonly<Record<F, Field>>;
  /** The f16 scale fields (d, then m or dmin where present). */
  readonly scales: readonly F[];
  readonly decode: BlockDecoder;
}

/** The names ggml gives a block's f16 scale fields. */
const SCALE_FIELDS: readonly string[] = ["d", "m", "dmin"];

/** What names a format: our type name, ggml's number for it, and elements per block. */
export interface FormatId<T extends string> {
  readonly type: T;
  readonly ggmlType: number;
  readonly elements: number;
}

/**
 * A format from its fields in block order, each [name, bytes]: offsets are the running sum, so
 * a layout is written as ggml-common.h's struct is, and cannot overlap or leave a gap. The
 * decoder is given the fields' offsets and the block's bytes, so it restates neither.
 */
export function runFormat<const T extends string, const F extends string>(
  id: FormatId<T>,
  fieldList: readonly (readonly [F, number])[],
  decoder: (fields: Readonly<Record<F, Field>>, bytes: number) => BlockDecoder,
): BlockFormat<T, F> {
  const fields = {} as Record<F, Field>;
  let at = 0;
  for (const [name, bytes] of fieldList) {
    fields[name] = { at, bytes };
    at += bytes;
  }
  return {
    ...id,
    ggmlName: id.type.toUpperCase(),
    bytes: at,
    fields,
    scales: fieldList.map(([name]) => name).filter((name) => SCALE_FIELDS.includes(name)),
    decode: decoder(fields, at),
  };
}

/** A quantized format whose decoder is written for one block: the loop over blocks is here. */
export function blockFormat<const T extends string, const F extends string>(
  id: FormatId<T>,
  fieldList: readonly (readonly [F, number])[],
  one: (fields: Readonly<Record<F, Field>>) => OneBlock,
): BlockFormat<T, F> {
  return runFormat(id, fieldList, (fields, bytes) => {
    const decodeOne = one(fields);
    return (u, at, out, o, blocks) => {
      const h = halves();
      for (let b = 0; b < blocks; b++) decodeOne(u, at + b * bytes, out, o + b * id.elements, h);
    };
  });
}
