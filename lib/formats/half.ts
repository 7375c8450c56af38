/** IEEE half precision, the encoding of every block scale and of f16 weights. */

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

let f16Table: Float32Array | undefined;
/** All 65536 half values, so a block scale costs a lookup. */
export function halves(): Float32Array {
  if (!f16Table) {
    f16Table = new Float32Array(65536);
    for (let i = 0; i < 65536; i++) f16Table[i] = f16ToF32(i);
  }
  return f16Table;
}

/** The little-endian half at u[at], as a number. */
export function half(h: Float32Array, u: Uint8Array, at: number): number {
  return h[u[at]! | (u[at + 1]! << 8)]!;
}
