/** Element encodings a weight tensor can have. Quantized types pack blocks along the innermost dimension. */
export type TensorType = "f32" | "f16" | "q8_0" | "q4_0";

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

/** Elements per quantization block and bytes per block, for each tensor type. */
export const BLOCK_LAYOUT: Record<TensorType, { elements: number; bytes: number }> = {
  f32: { elements: 1, bytes: 4 },
  f16: { elements: 1, bytes: 2 },
  q8_0: { elements: 32, bytes: 34 },
  q4_0: { elements: 32, bytes: 18 },
};

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
      `Cannot size ${type} tensor: innermost dimension must be a multiple of ${elements}, received shape [${shape.join(", ")}]`,
    );
  }
  return (elementCount(shape) / elements) * bytes;
}
