import { BLOCK_LAYOUT, type TensorType } from "../lib/model/tensor.ts";

/**
 * WGSL that reads weights in their file encoding from `W: array<u32>` (f32 matmuls use
 * `array<vec4<f32>>`). GGUF blocks are 34 (Q8_0) or 18 (Q4_0) bytes, so a block starts on a
 * 2-byte boundary only: it is read as whole words and shifted into place.
 */

/** Helpers shared by every reader. */
export const WGSL_WEIGHT_HELPERS = /* wgsl */ `
// The f16 at a 2-aligned byte offset.
fn halfAt(byteOff: u32) -> f32 {
  let h = unpack2x16float(W[byteOff >> 2u]);
  return select(h.x, h.y, (byteOff & 2u) != 0u);
}
// Four signed bytes of a word, low byte first.
fn i8x4(w: u32) -> vec4<f32> {
  return vec4<f32>(vec4<i32>(
    bitcast<i32>(w << 24u) >> 24u,
    bitcast<i32>(w << 16u) >> 24u,
    bitcast<i32>(w << 8u) >> 24u,
    bitcast<i32>(w) >> 24u));
}
// Low and high nibbles of a word's four bytes, minus 8 (Q4_0's zero point).
fn lo4(v: u32) -> vec4<f32> {
  return vec4<f32>(vec4<u32>(v & 15u, (v >> 8u) & 15u, (v >> 16u) & 15u, (v >> 24u) & 15u)) - 8.0;
}
fn hi4(v: u32) -> vec4<f32> {
  return vec4<f32>(vec4<u32>((v >> 4u) & 15u, (v >> 12u) & 15u, (v >> 20u) & 15u, v >> 28u)) - 8.0;
}
`;

/** Bytes of one row of `cols` elements. */
export function rowBytes(type: TensorType, cols: number): number {
  const { elements, bytes } = BLOCK_LAYOUT[type];
  return (cols / elements) * bytes;
}

/** The types these kernels read. */
export const GPU_TENSOR_TYPES: readonly TensorType[] = ["f32", "f16", "q8_0", "q4_0"];

/**
 * `fn weightAt(o: u32, j: u32) -> f32`: element j of row o, dequantized exactly as
 * lib/dequantize.ts does (d * q is exact in f32 for both block formats).
 */
export function wgslWeightAt(type: TensorType, cols: number): string {
  const rb = rowBytes(type, cols);
  switch (type) {
    case "f32":
      return `fn weightAt(o: u32, j: u32) -> f32 { return bitcast<f32>(W[o * ${cols}u + j]); }`;
    case "f16":
      return `fn weightAt(o: u32, j: u32) -> f32 { return halfAt((o * ${cols}u + j) * 2u); }`;
    case "q8_0":
      return `fn weightAt(o: u32, j: u32) -> f32 {
  let off = o * ${rb}u + (j / 32u) * 34u;
  let b = off + 2u + (j % 32u);
  let q = bitcast<i32>(W[b >> 2u] << (24u - (b & 3u) * 8u)) >> 24u;
  return halfAt(off) * f32(q);
}`;
    case "q4_0":
      return `fn weightAt(o: u32, j: u32) -> f32 {
  let off = o * ${rb}u + (j / 32u) * 18u;
  let jj = j % 32u;
  let b = off + 2u + (jj % 16u);
  let byte = (W[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
  let q = select(byte & 15u, byte >> 4u, jj >= 16u);
  return halfAt(off) * (f32(q) - 8.0);
}`;
    default:
      throw new Error(`The WebGPU kernels cannot read ${type} weights yet`);
  }
}

/** Elements per matmul work item: a vec4 for float types, one 32-element block for quantized. */
export function chunkElements(type: TensorType): number {
  return type === "f32" || type === "f16" ? 4 : 32;
}

/** Activation vec4s per work item. */
export function chunkVec4s(type: TensorType): number {
  return chunkElements(type) / 4;
}

/**
 * Statements loading chunk `c` of weight row `rowExpr` into `let` bindings named with `p`:
 * the dequantized vec4s are p0, p1, ... (one per activation vec4) and a per-chunk scale pd.
 */
export function wgslLoadChunk(type: TensorType, cols: number, rowExpr: string, p: string): string {
  const n = cols / chunkElements(type);
  switch (type) {
    case "f32":
      return `let ${p}d = 1.0; let ${p}0 = W[(${rowExpr}) * ${n}u + c];`;
    case "f16":
      return `let ${p}b = ((${rowExpr}) * ${n}u + c) * 2u;
      let ${p}d = 1.0;
      let ${p}0 = vec4<f32>(unpack2x16float(W[${p}b]), unpack2x16float(W[${p}b + 1u]));`;
    case "q8_0": {
      // Words w0..w8 cover the 34 bytes whether the block starts at byte 0 or 2 of a word.
      const words = Array.from({ length: 9 }, (_, i) => `let ${p}w${i} = W[${p}wi + ${i}u];`).join(
        " ",
      );
      const qs = Array.from(
        { length: 8 },
        (_, i) =>
          `let ${p}${i} = i8x4(select((${p}w${i} >> 16u) | (${p}w${i + 1} << 16u), ${p}w${
            i + 1
          }, ${p}odd));`,
      ).join("\n      ");
      return `let ${p}off = (${rowExpr}) * ${rowBytes(type, cols)}u + c * 34u;
      let ${p}wi = ${p}off >> 2u;
      let ${p}odd = (${p}off & 2u) != 0u;
      ${words}
      let ${p}h = unpack2x16float(${p}w0);
      let ${p}d = select(${p}h.x, ${p}h.y, ${p}odd);
      ${qs}`;
    }
    case "q4_0": {
      const words = Array.from({ length: 5 }, (_, i) => `let ${p}w${i} = W[${p}wi + ${i}u];`).join(
        " ",
      );
      const nib = Array.from(
        { length: 4 },
        (_, i) =>
          `let ${p}n${i} = select((${p}w${i} >> 16u) | (${p}w${i + 1} << 16u), ${p}w${
            i + 1
          }, ${p}odd);`,
      ).join("\n      ");
      // Byte k of the 16 holds element k (low nibble) and element k + 16 (high nibble).
      const vals = Array.from(
        { length: 4 },
        (_, i) => `let ${p}${i} = lo4(${p}n${i}); let ${p}${i + 4} = hi4(${p}n${i});`,
      )
        .join("\n      ");
      return `let ${p}off = (${rowExpr}) * ${rowBytes(type, cols)}u + c * 18u;
      let ${p}wi = ${p}off >> 2u;
      let ${p}odd = (${p}off & 2u) != 0u;
      ${words}
      let ${p}h = unpack2x16float(${p}w0);
      let ${p}d = select(${p}h.x, ${p}h.y, ${p}odd);
      ${nib}
      ${vals}`;
    }
    default:
      throw new Error(`The WebGPU kernels cannot read ${type} weights yet`);
  }
}
