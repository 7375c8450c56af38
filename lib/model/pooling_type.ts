/**
 * How a sequence's hidden states become one embedding, as llama.cpp's `pooling_type` says
 * (GGUF `<arch>.pooling_type`: 1 mean, 2 cls, 3 last): the mean of every row, the first row,
 * or the last row.
 */
export type Pooling = "mean" | "cls" | "last";

/** The poolings, in the order of their GGUF codes 1, 2, 3. */
export const POOLINGS: readonly Pooling[] = ["mean", "cls", "last"];

/**
 * The pooling a GGUF `pooling_type` code names; undefined for none (0), rank (4) and
 * unspecified (-1 or absent), which do not give one vector per input.
 */
export function poolingOfCode(code: unknown): Pooling | undefined {
  return typeof code === "number" && code >= 1 && code <= 3 ? POOLINGS[code - 1] : undefined;
}
