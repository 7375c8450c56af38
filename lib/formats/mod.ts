/**
 * Every weight format the engines read, in type-code order: a format's index here is the type
 * code the CPU kernels switch on (kernels/wasm/as/formats.ts is generated from this table).
 */
import type { BlockFormat } from "./block_format.ts";
import { BF16, F16, F32 } from "./float.ts";
import { Q8_0 } from "./q8_0.ts";
import { Q4_0 } from "./q4_0.ts";
import { Q4_1 } from "./q4_1.ts";
import { Q5_0, Q5_1 } from "./q5.ts";
import { Q2_K } from "./q2_k.ts";
import { Q3_K } from "./q3_k.ts";
import { Q4_K } from "./q4_k.ts";
import { Q5_K } from "./q5_k.ts";
import { Q6_K } from "./q6_k.ts";

export { BF16, F16, F32, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0 };
export type { BlockDecoder, BlockFormat, Field, OneBlock } from "./block_format.ts";

export const FORMATS = [
  F32,
  F16,
  BF16,
  Q8_0,
  Q4_0,
  Q4_1,
  Q5_0,
  Q5_1,
  Q2_K,
  Q3_K,
  Q4_K,
  Q5_K,
  Q6_K,
] as const;

/**
 * Element encodings a weight tensor can have, named after ggml's types. Quantized types pack
 * blocks along the innermost dimension: 32 elements for the legacy types (q4_0 ... q8_0), 256
 * for the K-quants (q2_k ... q6_k).
 */
export type TensorType = (typeof FORMATS)[number]["type"];

/** What `pick` gives for each type's format, by type name. */
export function byType<V>(pick: (f: BlockFormat) => V): Record<TensorType, V> {
  const out: Partial<Record<TensorType, V>> = {};
  for (const f of FORMATS) out[f.type] = pick(f);
  return out as Record<TensorType, V>;
}

/** Each type's format, by name. */
export const FORMAT: Readonly<Record<TensorType, BlockFormat>> = byType((f) => f);

/** Every tensor type, in type-code order. */
export const TENSOR_TYPES: TensorType[] = FORMATS.map((f) => f.type);
