/**
 * How the KV pools hold their elements. "f16" halves the cache: each element is rounded to the
 * nearest f16 once, when it is written, and attention still multiplies and adds in f32. It
 * needs the device's `shader-f16` feature (WGSL's f16 type); packing pairs into u32 words with
 * the core pack2x16float / unpack2x16float would not, but Mesa's llvmpipe returns 0 for the
 * second half of an unpack2x16float bound to a `let`, so the engine uses f16 storage directly.
 */
export type KvDtype = "f16" | "f32";

export function kvElementBytes(dtype: KvDtype): number {
  return dtype === "f16" ? 2 : 4;
}

/** WGSL for one dtype's pool accesses; indices are in elements (vec4s for loadVec4). */
export interface KvWgsl {
  /** The directive a shader using these accesses starts with ("" for f32). */
  readonly enable: string;
  /** The pool's array type when read element by element. */
  readonly scalarArray: string;
  /** The pool's array type when read four elements at a time. */
  readonly vec4Array: string;
  /** Stores elements i and i + 1 from a vec2<f32>. */
  storePair(pool: string, i: string, v: string): string;
  /** Element i as f32. */
  load(pool: string, i: string): string;
  /** Elements 4j .. 4j + 3 as a vec4<f32> (from the vec4Array view). */
  loadVec4(pool: string, j: string): string;
}

export function kvWgsl(dtype: KvDtype): KvWgsl {
  const f16 = dtype === "f16";
  const t = f16 ? "f16" : "f32";
  const cast = (x: string) => (f16 ? `f16(${x})` : x);
  return {
    enable: f16 ? "enable f16;" : "",
    scalarArray: `array<${t}>`,
    vec4Array: `array<vec4<${t}>>`,
    storePair: (p, i, v) =>
      `{ let kvv = ${v}; let kvi = ${i}; ${p}[kvi] = ${cast("kvv.x")}; ${p}[kvi + 1u] = ${
        cast("kvv.y")
      }; }`,
    load: (p, i) => (f16 ? `f32(${p}[${i}])` : `${p}[${i}]`),
    loadVec4: (p, j) => (f16 ? `vec4<f32>(${p}[${j}])` : `${p}[${j}]`),
  };
}
