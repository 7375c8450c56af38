import { type Tensor, elementCount } from "./tensor.ts";

const f16Scratch = new DataView(new ArrayBuffer(2));

/** Converts one IEEE half-precision value (as its 16 bits) to a number. */
export function f16ToF32(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >> 10) & 0x1f;
  const frac = bits & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/** Rounds a number to the nearest half-precision value and returns its 16 bits. */
export function f32ToF16(value: number): number {
  // Math.f16round exists in Deno 2.x; the DataView does the bit packing.
  f16Scratch.setFloat16(0, value, true);
  return f16Scratch.getUint16(0, true);
}

/**
 * Expands a tensor to f32, whatever its encoding. This is the CPU reference's view of the
 * weights; GPU kernels read the raw blocks instead.
 */
export function dequantize(t: Tensor): Float32Array {
  const n = elementCount(t.shape);
  const out = new Float32Array(n);
  const view = new DataView(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  switch (t.type) {
    case "f32":
      for (let i = 0; i < n; i++) out[i] = view.getFloat32(i * 4, true);
      return out;
    case "f16":
      for (let i = 0; i < n; i++) out[i] = f16ToF32(view.getUint16(i * 2, true));
      return out;
    case "q8_0":
      for (let b = 0; b < n / 32; b++) {
        const d = f16ToF32(view.getUint16(b * 34, true));
        for (let j = 0; j < 32; j++) out[b * 32 + j] = d * view.getInt8(b * 34 + 2 + j);
      }
      return out;
    case "q4_0":
      for (let b = 0; b < n / 32; b++) {
        const d = f16ToF32(view.getUint16(b * 18, true));
        for (let j = 0; j < 16; j++) {
          const q = view.getUint8(b * 18 + 2 + j);
          out[b * 32 + j] = d * ((q & 0x0f) - 8);
          out[b * 32 + j + 16] = d * ((q >> 4) - 8);
        }
      }
      return out;
  }
}
