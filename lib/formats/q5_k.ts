import { blockFormat } from "./block_format.ts";
import { kBlock } from "./q4_k.ts";

/** Q4_K with a fifth bit per element (see kBlock). */
export const Q5_K = blockFormat(
  { type: "q5_k", ggmlType: 13, elements: 256 },
  [["d", 2], ["dmin", 2], ["scales", 12], ["qh", 32], ["qs", 128]],
  kBlock,
);
