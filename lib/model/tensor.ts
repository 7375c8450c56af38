import { byType, FORMAT, TENSOR_TYPES, type TensorType } from "../formats/mod.ts";

export { TENSOR_TYPES, type TensorType };

/**
 * A weight tensor as stored in the model file. `shape` lists dimensions outermost first
 * (a matrix applied as y = W·x has shape [outFeatures, inFeatures]); `data` holds the raw
 * bytes in the file's encoding, so GPU kernels can consume quantized blocks directly.
 */
export interface Tensor {
  readonly name: string;
  readonly type: TensorType;
  readonly shape: readonly number[];
  readonly data: Uint8Array;
}

/** Elements per quantization block and bytes per block, for each tensor type (lib/formats). */
export const BLOCK_LAYOUT: Readonly<Record<TensorType, { elements: number; bytes: number }>> =
  FORMAT;

/** Byte offsets of the f16 scale fields (d, and dmin or m where present) in each block type. */
export const BLOCK_SCALE_OFFSETS: Readonly<Record<TensorType, readonly number[]>> = byType((f) =>
  f.scales.map((name) => f.fields[name]!.at)
);

/** Number of elements in a tensor of this shape. */
export function elementCount(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** Bytes a tensor of this type and shape occupies. Throws when the innermost dimension does not fill whole blocks. */
export function byteSize(type: TensorType, shape: readonly number[]): number {
  const { elements, bytes } = BLOCK_LAYOUT[type];
  const inner = shape[shape.length - 1] ?? 1;
  if (inner % elements !== 0) {
    throw new Error(
      `Cannot size ${type} tensor: innermost dimension must be a multiple of ${elements}, received shape [${
        shape.join(", ")
      }]`,
    );
  }
  return (elementCount(shape) / elements) * bytes;
}
