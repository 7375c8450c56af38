import { runFormat } from "./block_format.ts";
import { halves } from "./half.ts";

// Plain floats: a "block" is one element, decoded a run at a time.

export const F32 = runFormat(
  { type: "f32", ggmlType: 0, elements: 1 },
  [["value", 4]],
  () => (u, at, out, o, n) => {
    out.set(new Float32Array(u.buffer.slice(u.byteOffset + at, u.byteOffset + at + 4 * n)), o);
  },
);

export const F16 = runFormat(
  { type: "f16", ggmlType: 1, elements: 1 },
  [["value", 2]],
  () => (u, at, out, o, n) => {
    const h = halves();
    for (let i = 0; i < n; i++) out[o + i] = h[u[at + 2 * i]! | (u[at + 2 * i + 1]! << 8)]!;
  },
);

/** The top half of an f32's bits. */
export const BF16 = runFormat(
  { type: "bf16", ggmlType: 30, elements: 1 },
  [["value", 2]],
  () => (u, at, out, o, n) => {
    const bits = new Uint32Array(out.buffer, out.byteOffset + 4 * o, n);
    for (let i = 0; i < n; i++) {
      bits[i] = ((u[at + 2 * i]! << 16) | (u[at + 2 * i + 1]! << 24)) >>>
        0;
    }
  },
);
