import {
  type Field,
  FORMAT as BLOCK_LAYOUT,
  Q2_K,
  Q3_K,
  Q4_1,
  Q4_K,
  Q5_1,
  Q5_K,
  Q6_K,
  type TensorType,
} from "../../lib/formats/mod.ts";

/**
 * WGSL that reads weights in their file encoding from `W: array<u32>` (f32 matmuls use
 * `array<vec4<f32>>`) and, where blocks start on 16 bytes, `W4: array<vec4<u32>>`
 * ({@link wgslWeights}), with one change on the device: blocks of 34 (Q8_0), 18 (Q4_0), 22
 * (Q5_0), 110 (Q3_K) or 210 (Q6_K) bytes are laid out so that their fields start on a word or
 * on 16 bytes ({@link DEVICE_LAYOUT}). Read in place, such blocks start on a 2-byte boundary
 * every other block, and their fields cost two loads and a select each; on llvmpipe every
 * storage load is also a loop over the SIMD lanes, where a vec4 costs less than three words.
 * Every reader yields one chunk (chunkElements): 4 elements of a float type, or 32 of a block
 * type (a Q8_0..Q5_1 block, or one eighth of a K-quant super-block), or 64 of Q4_K and Q5_K
 * (a quarter super-block).
 */

/** A field of a block type (lib/formats), or undefined where the type has none. */
function field(type: TensorType, name: string): Field | undefined {
  return (BLOCK_LAYOUT[type].fields as Readonly<Record<string, Field>>)[name];
}

/** WGSL for `n + ` (nothing for 0), an offset added to an address. */
const plus = (n: number) => (n ? `${n}u + ` : "");

/** Helpers shared by every reader (wgslWeights declares them with the weights). */
const WGSL_WEIGHT_HELPERS = /* wgsl */ `
// Four signed bytes of a word, low byte first.
fn i8x4(w: u32) -> vec4<f32> {
  return vec4<f32>(vec4<i32>(
    bitcast<i32>(w << 24u) >> 24u,
    bitcast<i32>(w << 16u) >> 24u,
    bitcast<i32>(w << 8u) >> 24u,
    bitcast<i32>(w) >> 24u));
}
// Bits shift.. of each of a word's four bytes, masked: nibbles, 2-bit fields, single bits.
fn fields(w: u32, shift: u32, mask: u32) -> vec4<u32> {
  return (vec4<u32>(w) >> (vec4<u32>(0u, 8u, 16u, 24u) + shift)) & vec4<u32>(mask);
}
// The four bytes of a word, low byte first.
fn bytes4(w: u32) -> vec4<u32> {
  return (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u);
}
// Bits s..s + 3 of qh (the fifth bits of four Q5_0/Q5_1 elements) moved to bit 4 of each of
// a word's four bytes: multiplying by 0x204081 copies the nibble to bits 0, 7, 14 and 21, so
// bit j lands at 8j, with no carries. Then one OR with the nibbles gives four 5-bit values in
// a word and bytes4() takes them apart: a third fewer integer operations than bit by bit.
fn qhSpread(qh: u32, s: u32) -> u32 {
  return ((((qh >> s) & 15u) * 0x204081u) & 0x01010101u) << 4u;
}
// Byte k (0..11) of the 12 bytes held in words a, b, c.
fn byte12(a: u32, b: u32, c: u32, k: u32) -> u32 {
  let w = select(select(c, b, k < 8u), a, k < 4u);
  return (w >> ((k & 3u) * 8u)) & 255u;
}
// Scale and min of sub-block j of a Q4_K/Q5_K block (6 bits each, packed in 12 bytes).
fn kScaleMin(a: u32, b: u32, c: u32, j: u32) -> vec2<f32> {
  let low = vec2<u32>(byte12(a, b, c, j) & 63u, byte12(a, b, c, j + 4u) & 63u);
  let packed = byte12(a, b, c, j + 4u);
  let high = vec2<u32>((packed & 15u) | ((byte12(a, b, c, j - 4u) >> 6u) << 4u),
                       (packed >> 4u) | ((byte12(a, b, c, j) >> 6u) << 4u));
  return vec2<f32>(select(high, low, j < 4u));
}
// Scale k (0..15) of a Q3_K block: 4 low bits, 2 high bits, minus 32.
fn q3Scale(a: u32, b: u32, c: u32, k: u32) -> f32 {
  let lo = select(byte12(a, b, c, k - 8u) >> 4u, byte12(a, b, c, k) & 15u, k < 8u);
  let hi = (byte12(a, b, c, 8u + (k & 3u)) >> (2u * (k >> 2u))) & 3u;
  return f32(i32(lo | (hi << 4u)) - 32);
}
`;

/**
 * How the device lays out a block type whose file blocks are 2-aligned (34, 18, 22, 110 or 210
 * bytes), so that every field the kernels read starts on a word:
 * - "planes" (Q8_0, Q4_0, Q5_0, whose f16 scale leads): each row becomes its blocks' scales,
 *   then (Q5_0) their 32-bit fifth-bit masks, then their quants, each plane padded to 16
 *   bytes, so a block's quants are one or two 16-byte loads (`W4`, the same buffer as
 *   vec4<u32>). On llvmpipe each storage load is a loop over the SIMD lanes, a vec4 costing
 *   less than three words. Rows grow by the padding only (Qwen2.5's 896 columns: 1.3%).
 * - "pad" (Q3_K, Q6_K, whose f16 scale is last): zero bytes after each block up to a
 *   multiple of 16 (Q3_K 110 -> 112, Q6_K 210 -> 224: 6.7%), so that Q6_K's 32-byte runs
 *   of quants and high bits are two 16-byte loads each through `W4`.
 */
const DEVICE_LAYOUT: Partial<Record<TensorType, "planes" | "pad">> = {
  q8_0: "planes",
  q4_0: "planes",
  q5_0: "planes",
  q3_k: "pad",
  q6_k: "pad",
};

const pad16 = (n: number) => Math.ceil(n / 16) * 16;

/** Byte offsets of a "planes" row's planes, and its size. */
function planes(
  type: TensorType,
  cols: number,
): { qh: number; qs: number; qsBytes: number; bytes: number } {
  const blocks = cols / 32;
  const qh = pad16(field(type, "d")!.bytes * blocks);
  const qs = qh + pad16((field(type, "qh")?.bytes ?? 0) * blocks);
  const qsBytes = field(type, "qs")!.bytes;
  return { qh, qs, qsBytes, bytes: qs + blocks * qsBytes };
}

/**
 * A row's fields as planes: plane f holds `n` elements of `bytes` each from byte `at` of the
 * row (a "planes" type's scales, fifth bits and quants; one plane of whole blocks, or of
 * vec4 units for float types, otherwise). Row grouping ({@link wgslAt}) interleaves the rows of
 * a group plane by plane, element by element.
 */
function rowPlanes(type: TensorType, cols: number): { at: number; bytes: number; n: number }[] {
  const { elements, bytes } = BLOCK_LAYOUT[type];
  if (DEVICE_LAYOUT[type] === "planes") {
    const { qh, qs, qsBytes } = planes(type, cols);
    const blocks = cols / 32;
    const qhBytes = field(type, "qh")?.bytes;
    return [
      { at: 0, bytes: field(type, "d")!.bytes, n: blocks },
      ...(qhBytes ? [{ at: qh, bytes: qhBytes, n: blocks }] : []),
      { at: qs, bytes: qsBytes, n: blocks },
    ];
  }
  if (elements === 1) return [{ at: 0, bytes: 4 * bytes, n: cols / 4 }];
  return [{ at: 0, bytes: rowBytes(type, elements), n: cols / elements }];
}

/**
 * Rows a lane matmul's workgroup reads together (8 lanes x 4 outputs x gate and up), which a
 * CPU rasterizer's matrices interleave (uploadMatrix): row-major, each lane's load is a
 * separate stream through memory, 64 of them a workgroup, and llvmpipe loads lane by lane;
 * interleaved, a workgroup's loads of one chunk are one run of bytes and consecutive chunks
 * consecutive runs. A load-only kernel over 48 MB of vec4s ran 1.4-1.7x faster so.
 */
export const LANE_ROW_GROUP = 64;

/**
 * WGSL for the byte offset of element `block` of the plane at byte `at` of rows of `rowBytes`
 * bytes, with elements of `bytes`, in row `row` of a matrix whose rows are interleaved in
 * groups of `group` (a power of two): group g holds its rows' planes one after another, each
 * plane element by element, rows innermost:
 *   g * group * rowBytes + group * at + (block * group + row % group) * bytes.
 * With group 1 that is the row-major row * rowBytes + at + block * bytes.
 */
export function wgslAt(
  layout: { readonly group: number; readonly rowBytes: number },
  row: string,
  block: string,
  at: number,
  bytes: number,
): string {
  const { group, rowBytes } = layout;
  if (group === 1) {
    return `((${row}) * ${rowBytes}u + ${at ? `${at}u + ` : ""}(${block}) * ${bytes}u)`;
  }
  const lg = Math.log2(group);
  return `(((${row}) >> ${lg}u) * ${group * rowBytes}u + ${
    group * at
  }u + (((${block}) << ${lg}u) + ((${row}) & ${group - 1}u)) * ${bytes}u)`;
}

/**
 * Readers that load 16 bytes at a time through `W4` (array<vec4<u32>>; on llvmpipe a vec4 load
 * costs less than three word loads): Q4_K and Q5_K only so (their 144- and 176-byte blocks
 * start on 16 bytes), the "planes" types beside word loads from `W`.
 */
const VEC4_ONLY: ReadonlySet<TensorType> = new Set(["q4_k", "q5_k"]);

/** Whether a type's kernels bind the weights twice: as W (binding 2) and as W4 ({@link wgslWeights}). */
export function needsVec4View(type: TensorType): boolean {
  return DEVICE_LAYOUT[type] === "planes" || type === "q6_k";
}

/**
 * The weights' declarations for a type's reader: `W` at binding 2 (vec4<f32> for f32, else
 * u32 words), or `W4` there for Q4_K and Q5_K; the "planes" types also get `W4` at
 * `vec4Binding`, which must be bound to the same buffer (needsVec4View). The quantized types
 * get the helpers their chunk readers (wgslLoadChunk) call.
 */
export function wgslWeights(type: TensorType, vec4Binding: number): string {
  const decl = (binding: number, name: string, elem: string) =>
    `@group(0) @binding(${binding}) var<storage, read> ${name}: array<${elem}>;`;
  if (type === "f32") return decl(2, "W", "vec4<f32>");
  if (VEC4_ONLY.has(type)) return `${decl(2, "W4", "vec4<u32>")}\n${WGSL_WEIGHT_HELPERS}`;
  return `${decl(2, "W", "u32")}
${needsVec4View(type) ? decl(vec4Binding, "W4", "vec4<u32>") : ""}
${w2Helper}
${WGSL_WEIGHT_HELPERS}`;
}

const w2Helper = /* wgsl */ `// The 32 bits at a 2-aligned byte offset.
fn w2(byteOff: u32) -> u32 {
  let i = byteOff >> 2u;
  return select(W[i], (W[i] >> 16u) | (W[i + 1u] << 16u), (byteOff & 2u) != 0u);
}`;

/** Whether the device holds this type's rows exactly as the file does. */
export function sameOnDevice(type: TensorType): boolean {
  return DEVICE_LAYOUT[type] === undefined;
}

/** Bytes of one row of `cols` elements on the device ({@link DEVICE_LAYOUT}). */
export function rowBytes(type: TensorType, cols: number): number {
  const { elements, bytes } = BLOCK_LAYOUT[type];
  const blocks = cols / elements;
  switch (DEVICE_LAYOUT[type]) {
    case "planes":
      return planes(type, cols).bytes;
    case "pad":
      return blocks * pad16(bytes);
    default:
      return blocks * bytes;
  }
}

/**
 * Copies whole rows of `type` from their file bytes `src` into `dst` in the device layout
 * ({@link DEVICE_LAYOUT}), rows interleaved in groups of `group` ({@link wgslAt}; `src` starts
 * a group, and a last partial group takes a whole group's bytes); `dst` must hold them and
 * start zeroed (pads are not written). Both must start on a 2-byte boundary.
 */
export function toDeviceRows(
  type: TensorType,
  cols: number,
  src: Uint8Array,
  dst: Uint8Array,
  group = 1,
): void {
  if (group === 1) return toDeviceRowMajor(type, cols, src, dst);
  const { elements, bytes } = BLOCK_LAYOUT[type];
  const fileRow = (cols / elements) * bytes;
  const rows = src.byteLength / fileRow;
  const dstRow = rowBytes(type, cols);
  const row = new Uint8Array(dstRow);
  const ps = rowPlanes(type, cols);
  // Small elements move as 16-bit units (every element and plane offset is even; words where
  // the destination allows): one subarray() and set() each took 26-31 ms for a 4,864 x 896
  // Q5_0 matrix, this 7-11 ms.
  const wide = dst.byteOffset % 4 === 0 && ps.every((p) => p.bytes % 4 === 0 && p.at % 4 === 0);
  const unit = wide ? 4 : 2;
  const view = (b: Uint8Array) =>
    wide
      ? new Uint32Array(b.buffer, b.byteOffset, b.byteLength >> 2)
      : new Uint16Array(b.buffer, b.byteOffset, b.byteLength >> 1);
  if (dst.byteOffset % 2 !== 0 || dst.byteLength % unit !== 0) {
    throw new Error(
      `Cannot lay out ${type} rows at byte offset ${dst.byteOffset} (${dst.byteLength} bytes): the device copy must start and end on a ${unit}-byte boundary`,
    );
  }
  const rowUnits = view(row);
  const dstUnits = view(dst);
  for (let r = 0; r < rows; r++) {
    row.fill(0);
    toDeviceRowMajor(type, cols, src.subarray(r * fileRow, (r + 1) * fileRow), row);
    const base = Math.floor(r / group) * group * dstRow;
    const t = r % group;
    for (const p of ps) {
      const n = p.bytes / unit;
      for (let b = 0; b < p.n; b++) {
        const from = p.at + b * p.bytes;
        const to = base + group * p.at + (b * group + t) * p.bytes;
        if (p.bytes >= 64) {
          dst.set(row.subarray(from, from + p.bytes), to); // whole K-quant blocks: memcpy
          continue;
        }
        for (let k = 0; k < n; k++) dstUnits[to / unit + k] = rowUnits[from / unit + k]!;
      }
    }
  }
}

function toDeviceRowMajor(type: TensorType, cols: number, src: Uint8Array, dst: Uint8Array): void {
  const layout = DEVICE_LAYOUT[type];
  if (layout === undefined) {
    dst.set(src);
    return;
  }
  const { elements, bytes } = BLOCK_LAYOUT[type];
  const blocks = cols / elements;
  const srcRow = blocks * bytes;
  const dstRow = rowBytes(type, cols);
  const rows = src.byteLength / srcRow;
  if (layout === "planes") {
    // File block: d (an f16), [qh,] qs (lib/formats).
    const { qh, qs } = planes(type, cols);
    const fd = field(type, "d")!.at, fqh = field(type, "qh"), fqs = field(type, "qs")!;
    const qhBytes = fqh?.bytes ?? 0, qsBytes = fqs.bytes;
    for (let r = 0; r < rows; r++) {
      const d = r * dstRow;
      for (let b = 0, s = r * srcRow; b < blocks; b++, s += bytes) {
        dst[d + 2 * b] = src[s + fd]!;
        dst[d + 2 * b + 1] = src[s + fd + 1]!;
        // Byte loops: subarray() and set() for runs this short cost more than the copy.
        for (let k = 0, at = d + qh + qhBytes * b, from = s + (fqh?.at ?? 0); k < qhBytes; k++) {
          dst[at + k] = src[from + k]!;
        }
        for (let k = 0, at = d + qs + qsBytes * b, from = s + fqs.at; k < qsBytes; k++) {
          dst[at + k] = src[from + k]!;
        }
      }
    }
    return;
  }
  const sw = bytes / 2; // u16s per file block
  const s16 = new Uint16Array(src.buffer, src.byteOffset, (rows * srcRow) / 2);
  const d16 = new Uint16Array(dst.buffer, dst.byteOffset, (rows * dstRow) / 2);
  for (let r = 0; r < rows; r++) {
    let s = (r * srcRow) / 2;
    let d = (r * dstRow) / 2;
    for (let b = 0; b < blocks; b++, s += sw, d += pad16(bytes) / 2) {
      for (let i = 0; i < sw; i++) d16[d + i] = s16[s + i]!;
    }
  }
}

/**
 * Elements per matmul work item: a vec4 for float types, 32 for block types, and 64 for Q4_K
 * and Q5_K, whose sub-blocks 2p and 2p + 1 share one run of 32 quant bytes (low and high
 * nibbles): read one sub-block at a time, every quant word was loaded twice, and on llvmpipe,
 * where each storage load is a loop over the SIMD lanes, loads are most of a matmul's time.
 */
export function chunkElements(type: TensorType): number {
  if (type === "q4_k" || type === "q5_k") return 64;
  return BLOCK_LAYOUT[type].elements === 1 ? 4 : 32;
}

/** Activation vec4s per work item. */
export function chunkVec4s(type: TensorType): number {
  return chunkElements(type) / 4;
}

/**
 * What every quant of a Q4_0 (8) or Q5_0 (16) block is offset by (0 for other types). A matmul
 * may load the quants without it (wgslLoadChunk's `uncentered`) and subtract offset × the sum
 * of the chunk's activations once per product, d · (q·x − offset · Σx): the sum is shared by
 * every output a thread computes, the subtraction per weight vec4 is gone.
 */
export function chunkOffset(type: TensorType): number {
  return type === "q5_0" ? 16 : type === "q4_0" ? 8 : 0;
}

/**
 * Statements loading chunk `c` of weight row `rowExpr` into `let` bindings named with `p`:
 * vec4s p0, p1, ... (one per activation vec4) and a per-chunk scale pd, so that element i of
 * the chunk is pd * p[i/4][i%4], exactly the f32 lib/model/dequantize.ts gives (each value
 * takes the same products in the same order: the scale products are exact, and the last
 * operation rounds once).
 */
export function wgslLoadChunk(
  type: TensorType,
  cols: number,
  rowExpr: string,
  p: string,
  group = 1,
  /** Leave out the quants' offset ({@linkcode chunkOffset}): the caller subtracts it. */
  uncentered = false,
): string {
  const centre = uncentered || chunkOffset(type) === 0 ? "" : ` - ${chunkOffset(type).toFixed(1)}`;
  const layout = { group, rowBytes: rowBytes(type, cols) };
  const at = (block: string, plane: number, bytes: number) =>
    wgslAt(layout, rowExpr, block, plane, bytes);
  switch (type) {
    case "f32":
      return `let ${p}d = 1.0; let ${p}0 = W[${at("c", 0, 16)} >> 4u];`;
    case "f16":
      return `let ${p}b = ${at("c", 0, 8)} >> 2u;
      let ${p}d = 1.0;
      let ${p}0 = vec4<f32>(unpack2x16float(W[${p}b]), unpack2x16float(W[${p}b + 1u]));`;
    case "q8_0":
      // Planes (DEVICE_LAYOUT): the block's 32 signed bytes are two vec4<u32>.
      return `${planesHead(type, cols, at, p)}
      ${wgslVec4Words(p, "q", `${p}qat`, 2)}
      ${Array.from({ length: 8 }, (_, i) => `let ${p}${i} = i8x4(${p}q${i});`).join(" ")}`;
    case "q4_0": {
      // Planes: the block's 16 quant bytes are one vec4<u32>. Byte k holds element k (low
      // nibble) and element k + 16 (high nibble).
      const vals = Array.from(
        { length: 4 },
        (_, i) =>
          `let ${p}${i} = vec4<f32>(fields(${p}n${i}, 0u, 15u))${centre}; let ${p}${
            i + 4
          } = vec4<f32>(fields(${p}n${i}, 4u, 15u))${centre};`,
      ).join("\n      ");
      return `${planesHead(type, cols, at, p)}
      ${wgslVec4Words(p, "n", `${p}qat`, 1)}
      ${vals}`;
    }
    case "bf16":
      // The top halves of f32s: element 2k in the word's low half, 2k + 1 in its high half.
      return `let ${p}b = ${at("c", 0, 8)} >> 2u;
      let ${p}d = 1.0;
      let ${p}x = W[${p}b]; let ${p}y = W[${p}b + 1u];
      let ${p}0 = bitcast<vec4<f32>>(vec4<u32>(${p}x << 16u, ${p}x & 0xffff0000u, ${p}y << 16u, ${p}y & 0xffff0000u));`;
    case "q4_1":
    case "q5_1": {
      // d, m, [qh,] qs: 20 or 24 bytes, so rows and blocks are word-aligned. d * q + m.
      const five = type === "q5_1";
      const { bytes, fields } = five ? Q5_1 : Q4_1;
      const qsWord = fields.qs.at / 4;
      const q = (i: number, hi: boolean) =>
        five
          ? `bytes4(${nibbles(`${p}n${i}`, hi)} | qhSpread(${p}qh, ${hi ? 16 + 4 * i : 4 * i}u))`
          : `fields(${p}n${i}, ${hi ? 4 : 0}u, 15u)`;
      const vals = Array.from(
        { length: 4 },
        (_, i) =>
          `let ${p}${i} = ${p}dm.x * vec4<f32>(${q(i, false)}) + ${p}dm.y;
      let ${p}${i + 4} = ${p}dm.x * vec4<f32>(${q(i, true)}) + ${p}dm.y;`,
      ).join("\n      ");
      return `let ${p}wi = ${at("c", 0, bytes)} >> 2u;
      let ${p}d = 1.0;
      let ${p}dm = unpack2x16float(W[${p}wi${fields.d.at ? ` + ${fields.d.at / 4}u` : ""}]);
      ${five ? `let ${p}qh = W[${p}wi + ${Q5_1.fields.qh.at / 4}u];` : ""}
      ${words(p, "n", 4, (i) => `W[${p}wi + ${qsWord + i}u]`)}
      ${vals}`;
    }
    case "q5_0": {
      // Planes: the block's fifth bits are one word (element k's is bit k), its 16 quant bytes
      // one vec4<u32>.
      const vals = Array.from(
        { length: 4 },
        (_, i) =>
          `let ${p}${i} = vec4<f32>(bytes4(${nibbles(`${p}n${i}`, false)} | qhSpread(${p}qh, ${
            4 * i
          }u)))${centre};
      let ${p}${i + 4} = vec4<f32>(bytes4(${nibbles(`${p}n${i}`, true)} | qhSpread(${p}qh, ${
            16 + 4 * i
          }u)))${centre};`,
      ).join("\n      ");
      return `${planesHead(type, cols, at, p)}
      let ${p}qh = W[${at("c", planes(type, cols).qh, 4)} >> 2u];
      ${wgslVec4Words(p, "n", `${p}qat`, 1)}
      ${vals}`;
    }
    case "q2_k":
    case "q3_k":
    case "q4_k":
    case "q5_k":
    case "q6_k":
      return kQuantChunk(type, (block, bytes) => at(block, 0, bytes), p);
  }
}

/**
 * Block c of a row in the "planes" layout: its scale pd and pqat, the vec4 index of its quants
 * (DEVICE_LAYOUT), from `at` (wgslLoadChunk's addresses).
 */
function planesHead(
  type: TensorType,
  cols: number,
  at: (block: string, plane: number, bytes: number) => string,
  p: string,
): string {
  const { qs, qsBytes } = planes(type, cols);
  return `let ${p}sat = ${at("c", 0, 2)};
      let ${p}dd = unpack2x16float(W[${p}sat >> 2u]);
      let ${p}d = select(${p}dd.x, ${p}dd.y, (${p}sat & 2u) != 0u);
      let ${p}qat = ${at("c", qs, qsBytes)} >> 4u;`;
}

/** The low (or high) nibbles of a word's four bytes, each in the low bits of its byte. */
function nibbles(word: string, high: boolean): string {
  return high ? `((${word} >> 4u) & 0x0F0F0F0Fu)` : `(${word} & 0x0F0F0F0Fu)`;
}

/**
 * `n` 16-byte loads from `W4` at vec4 index `at` onwards, as words `<p><name>0` .. 4n - 1
 * (the readers' word names, whichever way they were loaded).
 */
export function wgslVec4Words(p: string, name: string, at: string, n: number): string {
  const loads = Array.from({ length: n }, (_, v) => `let ${p}${name}v${v} = W4[${at} + ${v}u];`);
  const c4 = ["x", "y", "z", "w"];
  return `${loads.join(" ")} ${words(p, name, 4 * n, (i) => `${p}${name}v${i >> 2}.${c4[i & 3]}`)}`;
}

/** `let <p><name>0 = <read(0)>; ...` for n words. */
function words(p: string, name: string, n: number, read: (i: number) => string): string {
  return Array.from({ length: n }, (_, i) => `let ${p}${name}${i} = ${read(i)};`).join(" ");
}

/**
 * One 32-element sub-block s = c % 8 of super-block c / 8 of a K-quant row (two, for Q4_K and
 * Q5_K: chunkElements), every element dequantized (pd = 1): the sub-block's scales differ per
 * 16 elements for Q2_K, Q3_K and Q6_K.
 * Element l of the sub-block sits in byte l of a 32-byte run (quants, high bits), so word i of
 * each run holds elements 4i..4i+3 and fields() takes them apart.
 */
function kQuantChunk(
  type: TensorType,
  blockAt: (block: string, bytes: number) => string,
  p: string,
): string {
  const bytes = rowBytes(type, 256);
  const head = `let ${p}off = ${blockAt("c >> 3u", bytes)};
      let ${p}s = c & 7u;
      let ${p}d = 1.0;`;
  // A 32-byte run at byte `at` of the block as 8 words (every device block is word-aligned).
  const run = (name: string, at: string) => {
    const b = `${p}${name}b`;
    return `let ${b} = (${p}off + ${at}) >> 2u; ${words(p, name, 8, (i) => `W[${b} + ${i}u]`)}`;
  };
  const word = (at: string) => `W[(${p}off + ${at}) >> 2u]`;
  // A 32-byte run at vec4 `at` from the block's first (hb) as 8 words: two 16-byte loads.
  const run4 = (name: string, at: string) => wgslVec4Words(p, name, `${p}hb + ${at}`, 2);
  const q3 = Q3_K.fields, q6 = Q6_K.fields;
  const vals = (expr: (i: number) => string) =>
    Array.from({ length: 8 }, (_, i) => `let ${p}${i} = ${expr(i)};`).join("\n      ");
  switch (type) {
    case "q2_k":
      // scales[16] (min << 4 | scale), qs[64], d, dmin. Half n = s/4, shift 2(s%4); scale
      // bytes 2s, 2s + 1 for elements 0..15, 16..31.
      return `${head}
      let ${p}dd = unpack2x16float(${word(`${Q2_K.fields.d.at}u`)});
      let ${p}sw = w2(${p}off + ${plus(Q2_K.fields.scales.at)}2u * ${p}s);
      let ${p}sa = ${p}sw & 255u; let ${p}sb = (${p}sw >> 8u) & 255u;
      let ${p}da = ${p}dd.x * f32(${p}sa & 15u); let ${p}ma = ${p}dd.y * f32(${p}sa >> 4u);
      let ${p}db = ${p}dd.x * f32(${p}sb & 15u); let ${p}mb = ${p}dd.y * f32(${p}sb >> 4u);
      let ${p}sh = 2u * (${p}s & 3u);
      ${run("q", `${plus(Q2_K.fields.qs.at)}32u * (${p}s >> 2u)`)}
      ${
        vals((i) =>
          `${p}d${i < 4 ? "a" : "b"} * vec4<f32>(fields(${p}q${i}, ${p}sh, 3u)) - ${p}m${
            i < 4 ? "a" : "b"
          }`
        )
      }`;
    case "q3_k":
      // hmask[32], qs[64], scales[12], d. As Q2_K's 2 bits, minus 4 where hmask[l]'s bit
      // 4n + j (n = s/4, j = s%4) is clear; signed 6-bit scales 2s, 2s + 1.
      return `${head}
      let ${p}sa = ${word(`${q3.scales.at}u`)}; let ${p}sb = ${
        word(`${q3.scales.at + 4}u`)
      }; let ${p}sc = ${word(`${q3.scales.at + 8}u`)};
      let ${p}dall = unpack2x16float(${word(`${q3.d.at}u`)}).x;
      let ${p}da = ${p}dall * q3Scale(${p}sa, ${p}sb, ${p}sc, 2u * ${p}s);
      let ${p}db = ${p}dall * q3Scale(${p}sa, ${p}sb, ${p}sc, 2u * ${p}s + 1u);
      let ${p}sh = 2u * (${p}s & 3u);
      let ${p}hbit = ${p}s;
      ${run("q", `${plus(q3.qs.at)}32u * (${p}s >> 2u)`)}
      ${run("h", `${q3.hmask.at}u`)}
      ${
        vals((i) =>
          `${p}d${
            i < 4 ? "a" : "b"
          } * (vec4<f32>(fields(${p}q${i}, ${p}sh, 3u)) - 4.0 + 4.0 * vec4<f32>(fields(${p}h${i}, ${p}hbit, 1u)))`
        )
      }`;
    case "q4_k":
    case "q5_k": {
      // d, dmin, scales[12], [qh[32],] qs[128]: word-aligned. Chunk c is sub-blocks 2t, 2t + 1
      // (t = c % 4) of super-block c / 4: one run of 32 qs bytes, low nibbles then high;
      // Q5_K's fifth bit of sub-block s is bit s of qh[l].
      const five = type === "q5_k";
      const q = (i: number, hi: boolean) => {
        const nib = `((${p}q${i} >> ${hi ? 4 : 0}u) & 0x0F0F0F0Fu)`;
        return five
          ? `bytes4(${nib} | (((${p}h${i} >> ${p}s${hi ? "b" : "a"}) & 0x01010101u) << 4u))`
          : `fields(${p}q${i}, ${hi ? 4 : 0}u, 15u)`;
      };
      const pairVals = Array.from({ length: 16 }, (_, i) => {
        const hi = i >= 8;
        const x = hi ? "b" : "a";
        return `let ${p}${i} = ${p}ds${x} * vec4<f32>(${q(i % 8, hi)}) - ${p}ms${x};`;
      }).join("\n      ");
      // Blocks of 144 and 176 bytes start on 16 bytes: the header (d, dmin, scales) is one
      // vec4<u32>, a 32-byte run two (W4; on llvmpipe a vec4 load costs less than three words).
      return `let ${p}hb = ${blockAt("c >> 2u", bytes)} >> 4u;
      let ${p}sa = 2u * (c & 3u); let ${p}sb = ${p}sa + 1u;
      let ${p}d = 1.0;
      let ${p}hd = W4[${p}hb];
      let ${p}dd = unpack2x16float(${p}hd.x);
      let ${p}sma = kScaleMin(${p}hd.y, ${p}hd.z, ${p}hd.w, ${p}sa);
      let ${p}smb = kScaleMin(${p}hd.y, ${p}hd.z, ${p}hd.w, ${p}sb);
      let ${p}dsa = ${p}dd.x * ${p}sma.x; let ${p}msa = ${p}dd.y * ${p}sma.y;
      let ${p}dsb = ${p}dd.x * ${p}smb.x; let ${p}msb = ${p}dd.y * ${p}smb.y;
      ${run4("q", `${(five ? Q5_K : Q4_K).fields.qs.at / 16}u + 2u * (c & 3u)`)}
      ${five ? run4("h", `${Q5_K.fields.qh.at / 16}u`) : ""}
      ${pairVals}`;
    }
    case "q6_k":
      // ql[128], qh[64], int8 scales[16], d. Half n = s/4, quarter k = s%4: low 4 bits from
      // ql[64n + 32(k%2) + l] (low nibble for k < 2), high 2 from qh[32n + l] at bit 2k;
      // minus 32; scales 8n + 2k, + 1.
      return `${head}
      let ${p}n = ${p}s >> 2u; let ${p}k = ${p}s & 3u;
      let ${p}sw = w2(${p}off + ${plus(q6.scales.at)}8u * ${p}n + 2u * ${p}k);
      let ${p}dall = unpack2x16float(${word(`${q6.d.at}u`)}).x;
      let ${p}da = ${p}dall * f32(bitcast<i32>(${p}sw << 24u) >> 24u);
      let ${p}db = ${p}dall * f32(bitcast<i32>(${p}sw << 16u) >> 24u);
      let ${p}sh = 4u * (${p}k >> 1u);
      let ${p}hs = 2u * ${p}k;
      let ${p}hb = ${p}off >> 4u;
      ${run4("q", `${plus(q6.ql.at / 16)}4u * ${p}n + 2u * (${p}k & 1u)`)}
      ${run4("h", `${plus(q6.qh.at / 16)}2u * ${p}n`)}
      ${
        vals((i) =>
          `${p}d${
            i < 4 ? "a" : "b"
          } * (vec4<f32>(bytes4(((${p}q${i} >> ${p}sh) & 0x0F0F0F0Fu) | (((${p}h${i} >> ${p}hs) & 0x03030303u) << 4u))) - 32.0)`
        )
      }`;
    default:
      throw new Error(`kQuantChunk() reads K-quants, received ${type}`);
  }
}
