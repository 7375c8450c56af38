import type { TensorType } from "../lib/tensor.ts";

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
`;

/**
 * `fn weightAt(o: u32, j: u32) -> f32`: element j of row o, dequantized exactly as
 * lib/dequantize.ts does (d * q is exact in f32 for both block formats).
 */
export function wgslWeightAt(type: TensorType, cols: number): string {
  const rowBytes = type === "q8_0" ? (cols / 32) * 34 : type === "q4_0" ? (cols / 32) * 18 : 0;
  switch (type) {
    case "f32":
      return `fn weightAt(o: u32, j: u32) -> f32 { return bitcast<f32>(W[o * ${cols}u + j]); }`;
    case "f16":
      return `fn weightAt(o: u32, j: u32) -> f32 { return halfAt((o * ${cols}u + j) * 2u); }`;
    case "q8_0":
      return `fn weightAt(o: u32, j: u32) -> f32 {
  let off = o * ${rowBytes}u + (j / 32u) * 34u;
  let b = off + 2u + (j % 32u);
  let q = bitcast<i32>(W[b >> 2u] << (24u - (b & 3u) * 8u)) >> 24u;
  return halfAt(off) * f32(q);
}`;
    case "q4_0":
      return `fn weightAt(o: u32, j: u32) -> f32 {
  let off = o * ${rowBytes}u + (j / 32u) * 18u;
  let jj = j % 32u;
  let b = off + 2u + (jj % 16u);
  let byte = (W[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
  let q = select(byte & 15u, byte >> 4u, jj >= 16u);
  return halfAt(off) * (f32(q) - 8.0);
}`;
  }
}

/** Elements per matmul work item: a vec4 for float types, one 32-element block for quantized. */
export function chunkElements(type: TensorType): number {
  return type === "f32" || type === "f16" ? 4 : 32;
}

/**
 * A matmul inner-loop body. In scope: o (row in this chunk), c (chunk index along the row),
 * r0, nRows, acc: array<f32, TR>, and X: array<vec4<f32>> with XV vec4 per activation row.
 * Each row's sum is accumulated in the same order whatever the batch, for batch invariance.
 */
export function wgslMatmulBody(type: TensorType, cols: number): string {
  const nChunks = cols / chunkElements(type);
  const perRow = (expr: string) => `
      for (var r = 0u; r < TR; r++) {
        if (r0 + r >= nRows) { break; }
        ${expr}
      }`;
  switch (type) {
    case "f32":
      return `
      let w = W[o * ${nChunks}u + c];${perRow("acc[r] += dot(w, X[(r0 + r) * XV + c]);")}`;
    case "f16":
      return `
      let base = (o * ${nChunks}u + c) * 2u;
      let w = vec4<f32>(unpack2x16float(W[base]), unpack2x16float(W[base + 1u]));${
        perRow("acc[r] += dot(w, X[(r0 + r) * XV + c]);")
      }`;
    case "q8_0":
      return `
      let off = o * ${(cols / 32) * 34}u + c * 34u;
      let wi = off >> 2u;
      let w0 = W[wi];
      var q: array<vec4<f32>, 8>;
      var d: f32;
      if ((off & 2u) != 0u) {
        d = unpack2x16float(w0).y;
        for (var i = 0u; i < 8u; i++) { q[i] = i8x4(W[wi + 1u + i]); }
      } else {
        d = unpack2x16float(w0).x;
        var prev = w0;
        for (var i = 0u; i < 8u; i++) {
          let next = W[wi + 1u + i];
          q[i] = i8x4((prev >> 16u) | (next << 16u));
          prev = next;
        }
      }${
        perRow(`let xb = (r0 + r) * XV + c * 8u;
        var sum = 0.0;
        for (var i = 0u; i < 8u; i++) { sum += dot(q[i], X[xb + i]); }
        acc[r] += d * sum;`)
      }`;
    case "q4_0":
      return `
      let off = o * ${(cols / 32) * 18}u + c * 18u;
      let wi = off >> 2u;
      let w0 = W[wi];
      var n: array<u32, 4>;
      var d: f32;
      if ((off & 2u) != 0u) {
        d = unpack2x16float(w0).y;
        for (var i = 0u; i < 4u; i++) { n[i] = W[wi + 1u + i]; }
      } else {
        d = unpack2x16float(w0).x;
        for (var i = 0u; i < 4u; i++) { n[i] = (W[wi + i] >> 16u) | (W[wi + i + 1u] << 16u); }
      }
      // Byte k of the 16: low nibble is element k, high nibble element k + 16.
      var lo: array<vec4<f32>, 4>;
      var hi: array<vec4<f32>, 4>;
      for (var i = 0u; i < 4u; i++) {
        let v = n[i];
        lo[i] = vec4<f32>(vec4<u32>(v & 15u, (v >> 8u) & 15u, (v >> 16u) & 15u, (v >> 24u) & 15u)) - 8.0;
        hi[i] = vec4<f32>(vec4<u32>((v >> 4u) & 15u, (v >> 12u) & 15u, (v >> 20u) & 15u, v >> 28u)) - 8.0;
      }${
        perRow(`let xb = (r0 + r) * XV + c * 8u;
        var sum = 0.0;
        for (var i = 0u; i < 4u; i++) { sum += dot(lo[i], X[xb + i]); }
        for (var i = 0u; i < 4u; i++) { sum += dot(hi[i], X[xb + 4u + i]); }
        acc[r] += d * sum;`)
      }`;
  }
}
