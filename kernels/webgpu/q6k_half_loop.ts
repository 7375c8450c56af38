import { rowBytes, wgslAt, wgslVec4Words } from "./weight_formats.ts";
import { Q6_K } from "../../lib/formats/mod.ts";

/**
 * WGSL for a lane kernel's loop over a Q6_K row (the classifier's and the matmuls' without a
 * fused norm or gate|up pair), adding into a{j}_{r} for the lane's outputs oc{j} and the tile's
 * rows r, whose input vec4 at index v of the row is input(r, v). It goes over half super-blocks (128 elements) instead of 32-element
 * chunks: the four sub-blocks of a half share its 64 ql bytes (low and high nibbles) and its
 * 32 qh bytes (2 bits each), so each word is loaded once, not once per sub-block (30 loads a
 * half against 84); device blocks start on 16 bytes (224), so the runs are vec4 loads.
 * Element (q - 32) * d * scale is summed as d * scale * Σ (q - 32) x per 16 elements, one
 * chain per (row, output) in order.
 */
export function q6kHalfLoop(
  cols: number,
  tile: number,
  outs: number,
  group: number,
  broadcast: boolean,
  input: (r: number, vec4: string) => string,
): string {
  const js = Array.from({ length: outs }, (_, j) => j);
  const rows = Array.from({ length: tile }, (_, r) => r);
  const run = (p: string, name: string, at: string, n: number) =>
    Array.from({ length: n }, (_, i) => `let ${p}${name}${i} = W[${p}b + ${at} + ${i}u];`).join(
      " ",
    );
  const block = rowBytes("q6_k", 256);
  const { ql, qh, scales, d } = Q6_K.fields;
  const vec4At = (at: number) => (at ? `${at / 16}u + ` : "");
  const loads = js.map((j) => {
    const p = `w${j}`;
    // Word offsets from the block's first word: ql at 16n, qh at 32 + 8n, scales at 48 + 2n
    // (lib/formats' Q6_K).
    const at = wgslAt({ group, rowBytes: (cols / 256) * block }, `oc${j}`, "h >> 1u", 0, block);
    return `let ${p}b = ${at} >> 2u;
      let ${p}n = h & 1u;
      ${wgslVec4Words(p, "q", `(${p}b >> 2u) + ${vec4At(ql.at)}4u * ${p}n`, 4)}
      ${wgslVec4Words(p, "h", `(${p}b >> 2u) + ${vec4At(qh.at)}2u * ${p}n`, 2)}
      ${run(p, "s", `${scales.at / 4}u + 2u * ${p}n`, 2)}
      let ${p}d = unpack2x16float(W[${p}b + ${d.at / 4}u]).x;`;
  }).join("\n      ");
  // Sub-block k of the half: ql words k%2 * 8 + i, nibble 4(k/2); qh bits 2k; scale bytes 2k, 2k + 1.
  const q = (p: string, k: number, i: number) =>
    `vec4<f32>(bytes4(((${p}q${(k % 2) * 8 + i} >> ${
      4 * (k >> 1)
    }u) & 0x0F0F0F0Fu) | (((${p}h${i} >> ${2 * k}u) & 0x03030303u) << 4u))) - 32.0`;
  const scale = (p: string, b: number) =>
    `f32(bitcast<i32>(${p}s${b >> 2} << ${24 - 8 * (b & 3)}u) >> 24u)`;
  const perRow = rows.map((r) => {
    const groups = [0, 1, 2, 3].flatMap((k) =>
      [0, 1].map((g) => {
        // Broadcast: lane sl loaded vec4 8k + sl of the half (xl{k}, below).
        const xs = [0, 1, 2, 3].map((i) =>
          broadcast
            ? `let x${i} = subgroupBroadcast(xl${k}, ${4 * g + i}u);`
            : `let x${i} = ${input(r, `h * 32u + ${8 * k + 4 * g + i}u`)};`
        ).join(" ");
        const acc = js.map((j) =>
          `a${j}_${r} += w${j}d * ${scale(`w${j}`, 2 * k + g)} * (${
            [0, 1, 2, 3].map((i) => `dot(${q(`w${j}`, k, 4 * g + i)}, x${i})`).join(" + ")
          });`
        ).join("\n        ");
        return `{ ${xs}
        ${acc} }`;
      })
    ).join("\n      ");
    const shared = broadcast
      ? [0, 1, 2, 3].map((k) => `let xl${k} = ${input(r, `h * 32u + ${8 * k}u + sl`)};`).join(" ")
      : "";
    return tile === 1 ? `{ ${shared} ${groups} }` : `if (${r}u < live) { ${shared} ${groups} }`;
  }).join("\n      ");
  return `for (var h = 0u; h < ${cols / 128}u; h++) {
      ${loads}
      ${perRow}
  }`;
}
