/**
 * Element encodings a weight tensor can have, named after ggml's types. Quantized types pack
 * blocks along the innermost dimension: 32 elements for the legacy types (q4_0 ... q8_0), 256
 * for the K-quants (q2_k ... q6_k).
 */
export type TensorType =
  | "f32"
  | "f16"
  | "bf16"
  | "q8_0"
  | "q4_0"
  | "q4_1"
  | "q5_0"
  | "q5_1"
  | "q2_k"
  | "q3_k"
  | "q4_k"
  | "q5_k"
  | "q6_k";

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
  bf16: { elements: 1, bytes: 2 },
  q8_0: { elements: 32, bytes: 34 }, // d, qs[32]
  q4_0: { elements: 32, bytes: 18 }, // d, qs[16]
  q4_1: { elements: 32, bytes: 20 }, // d, m, qs[16]
  q5_0: { elements: 32, bytes: 22 }, // d, qh[4], qs[16]
  q5_1: { elements: 32, bytes: 24 }, // d, m, qh[4], qs[16]
  q2_k: { elements: 256, bytes: 84 }, // scales[16], qs[64], d, dmin
  q3_k: { elements: 256, bytes: 110 }, // hmask[32], qs[64], scales[12], d
  q4_k: { elements: 256, bytes: 144 }, // d, dmin, scales[12], qs[128]
  q5_k: { elements: 256, bytes: 176 }, // d, dmin, scales[12], qh[32], qs[128]
  q6_k: { elements: 256, bytes: 210 }, // ql[128], qh[64], scales[16], d
};

/** Byte offsets of the f16 scale fields (d, and dmin or m where present) in each block type. */
export const BLOCK_SCALE_OFFSETS: Record<TensorType, readonly number[]> = {
  f32: [],
  f16: [],
  bf16: [],
  q8_0: [0],
  q4_0: [0],
  q4_1: [0, 2],
  q5_0: [0],
  q5_1: [0, 2],
  q2_k: [80, 82],
  q3_k: [108],
  q4_k: [0, 2],
  q5_k: [0, 2],
  q6_k: [208],
};

/** Every tensor type, in BLOCK_LAYOUT's order. */
export const TENSOR_TYPES = Object.keys(BLOCK_LAYOUT) as TensorType[];

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
