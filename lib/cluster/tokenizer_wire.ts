import { z } from "zod";
import type { TokenizerData } from "../tokenizer/tokenizer_data.ts";
import type { ByteStrings } from "../util/byte_strings.ts";

const id = z.number().int().nonnegative();

/** A vocabulary as JSON: what a router needs to tokenize exactly as its replicas do. */
export const TokenizerWire = z.object({
  tokens: z.array(z.string()),
  scores: z.array(z.number()),
  tokenTypes: z.array(z.number().int()).optional(),
  bosId: id,
  eosId: id,
  model: z.enum(["llama", "gpt2"]).optional(),
  pre: z.string().optional(),
  merges: z.array(z.string()).optional(),
  addBos: z.boolean().optional(),
  addEos: z.boolean().optional(),
  addSpacePrefix: z.boolean().optional(),
  eotId: id.optional(),
  eomId: id.optional(),
  fimPadId: id.optional(),
  fimRepId: id.optional(),
  fimSepId: id.optional(),
});
export type TokenizerWire = z.infer<typeof TokenizerWire>;

export function tokenizerToWire(t: TokenizerData): TokenizerWire {
  return {
    ...t,
    tokens: [...t.tokens],
    scores: Array.from(t.scores),
    tokenTypes: t.tokenTypes === undefined ? undefined : Array.from(t.tokenTypes),
    merges: t.merges === undefined
      ? undefined
      : Array.isArray(t.merges)
      ? [...t.merges]
      : Array.from({ length: t.merges.length }, (_, i) => (t.merges as ByteStrings).get(i)),
  };
}

export function tokenizerFromWire(w: TokenizerWire): TokenizerData {
  return {
    ...w,
    scores: Float32Array.from(w.scores),
    tokenTypes: w.tokenTypes === undefined ? undefined : Int32Array.from(w.tokenTypes),
  };
}
