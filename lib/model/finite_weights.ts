import { BLOCK_LAYOUT, BLOCK_SCALE_OFFSETS, type Tensor } from "./tensor.ts";
import type { ModelWeights } from "./weights.ts";

/**
 * Where a tensor holds a NaN or an infinity: a float value, or a quantized block's f16 scale
 * (its integer quants are finite by construction). undefined when it holds none.
 */
export function firstNonFinite(t: Tensor): { element: string; value: number } | undefined {
  const d = t.data;
  // Whole-element views (a copy where the data is not aligned to its element size).
  const view = <T>(size: number, make: (b: ArrayBufferLike, o: number, n: number) => T): T =>
    d.byteOffset % size === 0
      ? make(d.buffer, d.byteOffset, Math.floor(d.byteLength / size))
      : make(
        d.slice(0, d.byteLength - (d.byteLength % size)).buffer,
        0,
        Math.floor(d.byteLength / size),
      );
  if (t.type === "f32") {
    const x = view(4, (b, o, n) => new Float32Array(b, o, n));
    for (let i = 0; i < x.length; i++) {
      if (x[i]! - x[i]! !== 0) return { element: `element ${i}`, value: x[i]! };
    }
    return undefined;
  }
  if (t.type === "f16" || t.type === "bf16") {
    // f16: exponent bits 0x7c00 all set; bf16 (the top half of an f32): 0x7f80.
    const mask = t.type === "f16" ? 0x7c00 : 0x7f80;
    const h = view(2, (b, o, n) => new Uint16Array(b, o, n));
    for (let i = 0; i < h.length; i++) {
      if ((h[i]! & mask) === mask) {
        return { element: `element ${i}`, value: halfValue(t.type, h[i]!) };
      }
    }
    return undefined;
  }
  const v = new DataView(d.buffer, d.byteOffset, d.byteLength);
  const { bytes } = BLOCK_LAYOUT[t.type];
  const offsets = BLOCK_SCALE_OFFSETS[t.type];
  for (let b = 0; b * bytes + bytes <= d.byteLength; b++) {
    for (const o of offsets) {
      const h = v.getUint16(b * bytes + o, true);
      if ((h & 0x7c00) === 0x7c00) {
        return { element: `the scale of block ${b}`, value: halfValue("f16", h) };
      }
    }
  }
  return undefined;
}

function halfValue(type: "f16" | "bf16", h: number): number {
  return (h & (type === "f16" ? 0x03ff : 0x007f)) !== 0 ? NaN : (h & 0x8000 ? -Infinity : Infinity);
}

/**
 * Refuses weights holding a NaN or an infinity, naming the tensor: they load "fine" and then
 * every token's logits are NaN, which samples token 0 forever.
 */
export function assertFiniteWeights(w: ModelWeights, source: string): void {
  const seen = new Set<Tensor>();
  const all = [
    w.tokenEmbedding,
    w.outputNorm,
    w.output,
    ...w.layers.flatMap((l) => Object.values(l) as Tensor[]),
  ];
  for (const t of all) {
    if (t === undefined || seen.has(t)) continue;
    seen.add(t);
    const bad = firstNonFinite(t);
    if (bad) {
      throw new Error(
        `Cannot load model ${source}: tensor '${t.name}' (${t.type}) holds ${bad.value} at ${bad.element}: the file is corrupt`,
      );
    }
  }
}
