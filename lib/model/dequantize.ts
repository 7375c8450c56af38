import { BLOCK_LAYOUT, elementCount, type Tensor, type TensorType } from "./tensor.ts";

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
 * Decodes `blocks` consecutive blocks of one type from `u` (starting at byte `at`) into `out`
 * (starting at element `o`). Every formula follows ggml's reference dequantization
 * (ggml-quants.c); each product of a scale and a quant is exact in f32, so computing in f64
 * and storing to f32 rounds once, as ggml's f32 arithmetic does.
 */
type BlockDecoder = (u: Uint8Array, at: number, out: Float32Array, o: number) => void;

let f16Table: Float32Array | undefined;
/** All 65536 half values, so block scales cost a lookup. */
function halves(): Float32Array {
  if (!f16Table) {
    f16Table = new Float32Array(65536);
    for (let i = 0; i < 65536; i++) f16Table[i] = f16ToF32(i);
  }
  return f16Table;
}

const half = (h: Float32Array, u: Uint8Array, at: number) => h[u[at]! | (u[at + 1]! << 8)]!;

/**
 * Scale and min j (0..7) of a Q4_K/Q5_K block: 6 bits each, packed in 12 bytes. Bytes 0..3
 * hold scales 0..3 and bytes 4..7 mins 0..3 in their low 6 bits; scales and mins 4..7 take
 * their low 4 bits from bytes 8..11 (scale low nibble, min high nibble) and their top 2 bits
 * from the spare top bits of bytes 0..3 (scales) and 4..7 (mins).
 */
export function kScaleMin(u: Uint8Array, at: number, j: number): [number, number] {
  if (j < 4) return [u[at + j]! & 63, u[at + j + 4]! & 63];
  const lo = u[at + j + 4]!;
  return [(lo & 0xf) | ((u[at + j - 4]! >> 6) << 4), (lo >> 4) | ((u[at + j]! >> 6) << 4)];
}

/**
 * Scale j (0..15) of a Q3_K block, 6 bits with an offset of 32: the low 4 bits are byte j's
 * low nibble (j < 8) or byte j-8's high nibble, the top 2 bits come from byte 8 + j%4, at bit
 * 2*floor(j/4).
 */
export function q3kScale(u: Uint8Array, at: number, j: number): number {
  const lo = j < 8 ? u[at + j]! & 0xf : u[at + j - 8]! >> 4;
  const hi = (u[at + 8 + (j % 4)]! >> (2 * (j >> 2))) & 3;
  return (lo | (hi << 4)) - 32;
}

function decoder(type: TensorType, h: Float32Array): BlockDecoder {
  switch (type) {
    case "f32":
    case "f16":
    case "bf16":
      throw new Error(`${type} has no blocks`);
    case "q8_0":
      return (u, at, out, o) => {
        const d = half(h, u, at);
        for (let j = 0; j < 32; j++) out[o + j] = d * ((u[at + 2 + j]! << 24) >> 24);
      };
    case "q4_0":
      // Byte j holds element j in its low nibble and element j + 16 in its high one.
      return (u, at, out, o) => {
        const d = half(h, u, at);
        for (let j = 0; j < 16; j++) {
          const q = u[at + 2 + j]!;
          out[o + j] = d * ((q & 0xf) - 8);
          out[o + j + 16] = d * ((q >> 4) - 8);
        }
      };
    case "q4_1":
      return (u, at, out, o) => {
        const d = half(h, u, at);
        const m = half(h, u, at + 2);
        for (let j = 0; j < 16; j++) {
          const q = u[at + 4 + j]!;
          out[o + j] = d * (q & 0xf) + m;
          out[o + j + 16] = d * (q >> 4) + m;
        }
      };
    case "q5_0":
    case "q5_1": {
      // Bit j of the 32-bit qh is element j's fifth bit.
      const affine = type === "q5_1";
      const qsAt = affine ? 8 : 6;
      return (u, at, out, o) => {
        const d = half(h, u, at);
        const m = affine ? half(h, u, at + 2) : 0;
        const hAt = at + (affine ? 4 : 2);
        const qh = (u[hAt]! | (u[hAt + 1]! << 8) | (u[hAt + 2]! << 16) | (u[hAt + 3]! << 24)) >>> 0;
        const zero = affine ? 0 : 16;
        for (let j = 0; j < 16; j++) {
          const q = u[at + qsAt + j]!;
          const q0 = (q & 0xf) | (((qh >>> j) & 1) << 4);
          const q1 = (q >> 4) | (((qh >>> (j + 16)) & 1) << 4);
          out[o + j] = d * (q0 - zero) + m;
          out[o + j + 16] = d * (q1 - zero) + m;
        }
      };
    }
    case "q2_k":
      // Element e: half n = e>>7 and shift 2j (j = (e>>5)&3) of qs byte 32n + (e&31); scale
      // byte 8n + 2j + (e&31 >= 16) holds the 4-bit scale (low) and 4-bit min (high).
      return (u, at, out, o) => {
        const d = half(h, u, at + 80);
        const dmin = half(h, u, at + 82);
        for (let e = 0; e < 256; e++) {
          const n = e >> 7, j = (e >> 5) & 3, l = e & 31;
          const sc = u[at + 8 * n + 2 * j + (l >> 4)]!;
          const q = (u[at + 16 + 32 * n + l]! >> (2 * j)) & 3;
          out[o + e] = d * (sc & 0xf) * q - dmin * (sc >> 4);
        }
      };
    case "q3_k":
      // As Q2_K's low 2 bits, plus a high bit from hmask[e&31] at bit 4n + j: when clear, the
      // quant is lowered by 4. One signed 6-bit scale per 16 elements.
      return (u, at, out, o) => {
        const d = half(h, u, at + 108);
        for (let e = 0; e < 256; e++) {
          const n = e >> 7, j = (e >> 5) & 3, l = e & 31;
          const q = (u[at + 32 + 32 * n + l]! >> (2 * j)) & 3;
          const high = (u[at + l]! >> (4 * n + j)) & 1;
          out[o + e] = d * q3kScale(u, at + 96, 8 * n + 2 * j + (l >> 4)) * (q - (high ? 0 : 4));
        }
      };
    case "q4_k":
    case "q5_k": {
      // Sub-block s = e>>5 (32 elements) has its own 6-bit scale and min; pair s>>1 shares 32
      // qs bytes, the even sub-block taking low nibbles, the odd one high nibbles. Q5_K's
      // fifth bit of element e is bit s of qh[e&31].
      const five = type === "q5_k";
      const qsAt = five ? 48 : 16;
      return (u, at, out, o) => {
        const d = half(h, u, at);
        const dmin = half(h, u, at + 2);
        for (let s = 0; s < 8; s++) {
          const [sc, mn] = kScaleMin(u, at + 4, s);
          const ds = d * sc, ms = dmin * mn;
          const shift = 4 * (s & 1);
          for (let l = 0; l < 32; l++) {
            let q = (u[at + qsAt + 32 * (s >> 1) + l]! >> shift) & 0xf;
            if (five) q |= ((u[at + 16 + l]! >> s) & 1) << 4;
            out[o + 32 * s + l] = ds * q - ms;
          }
        }
      };
    }
    case "q6_k":
      // Element e: half n = e>>7, quarter k = (e>>5)&3, l = e&31. Low 4 bits: ql byte
      // 64n + 32(k&1) + l, low nibble for k < 2, else high; top 2 bits: qh byte 32n + l at bit
      // 2k. Minus 32, times the int8 scale 8n + 2k + (l >= 16).
      return (u, at, out, o) => {
        const d = half(h, u, at + 208);
        for (let e = 0; e < 256; e++) {
          const n = e >> 7, k = (e >> 5) & 3, l = e & 31;
          const lo = (u[at + 64 * n + 32 * (k & 1) + l]! >> (4 * (k >> 1))) & 0xf;
          const hi = (u[at + 128 + 32 * n + l]! >> (2 * k)) & 3;
          const sc = (u[at + 192 + 8 * n + 2 * k + (l >> 4)]! << 24) >> 24;
          out[o + e] = Math.fround(d * sc) * ((lo | (hi << 4)) - 32);
        }
      };
  }
}

/**
 * Expands a tensor to f32, whatever its encoding. This is the CPU reference's view of the
 * weights; GPU kernels read the raw blocks instead.
 */
export function dequantize(t: Tensor): Float32Array {
  const n = elementCount(t.shape);
  const out = new Float32Array(n);
  const u = t.data;
  switch (t.type) {
    case "f32":
      out.set(new Float32Array(u.slice(0, n * 4).buffer));
      return out;
    case "f16": {
      const h = halves();
      for (let i = 0; i < n; i++) out[i] = h[u[2 * i]! | (u[2 * i + 1]! << 8)]!;
      return out;
    }
    case "bf16": {
      // The top half of an f32's bits.
      const bits = new Uint32Array(out.buffer);
      for (let i = 0; i < n; i++) bits[i] = ((u[2 * i]! << 16) | (u[2 * i + 1]! << 24)) >>> 0;
      return out;
    }
    default: {
      const { elements, bytes } = BLOCK_LAYOUT[t.type];
      const decode = decoder(t.type, halves());
      const blocks = n / elements;
      if (u.byteLength < blocks * bytes) {
        throw new Error(
          `Cannot dequantize '${t.name}': ${t.type} [${t.shape.join(", ")}] needs ${
            blocks * bytes
          } bytes, received ${u.byteLength}`,
        );
      }
      for (let b = 0; b < blocks; b++) decode(u, b * bytes, out, b * elements);
      return out;
    }
  }
}
