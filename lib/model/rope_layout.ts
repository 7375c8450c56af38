import type { Tensor } from "./tensor.ts";

/**
 * Row order that takes a head's "neox" RoPE layout (pairs i, i + ropeDim/2) to "norm"
 * (adjacent pairs 2i, 2i+1): new row 2i is old row i, new row 2i+1 is old row i + ropeDim/2
 * (i < ropeDim/2), rows past ropeDim stay, for each of `heads` heads of `headDim` rows.
 * perm[newRow] = oldRow.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * assertEquals(neoxToNormOrder(1, 4, 4), [0, 2, 1, 3]);
 * ```
 */
export function neoxToNormOrder(heads: number, headDim: number, ropeDim: number): number[] {
  const half = ropeDim / 2;
  const perm: number[] = [];
  for (let h = 0; h < heads; h++) {
    const base = h * headDim;
    for (let i = 0; i < half; i++) perm.push(base + i, base + half + i);
    for (let j = ropeDim; j < headDim; j++) perm.push(base + j);
  }
  return perm;
}

/**
 * A copy of `t` whose row r is t's row perm[r] (for a vector, element perm[r]). Rows of every
 * GGUF type are independent runs of whole blocks, so this is exact for quantized matrices too.
 */
export function permuteRows(t: Tensor, perm: readonly number[]): Tensor {
  const rows = t.shape[0]!;
  const rowBytes = t.data.byteLength / rows;
  if (perm.length !== rows || !Number.isInteger(rowBytes)) {
    throw new Error(
      `Cannot reorder the rows of '${t.name}' ${t.type} [${
        t.shape.join(", ")
      }]: the order has ${perm.length} entries for ${rows} rows of ${rowBytes} bytes`,
    );
  }
  const data = new Uint8Array(t.data.byteLength);
  perm.forEach((from, r) => {
    data.set(t.data.subarray(from * rowBytes, (from + 1) * rowBytes), r * rowBytes);
  });
  return { ...t, data };
}
