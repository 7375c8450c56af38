import type { Tokenizer } from "../tokenizer/tokenizer.ts";

/** A vocabulary as XGrammar's TokenizerInfo takes it in its "raw" mode. */
export interface GrammarVocabulary {
  /** Each id's bytes as it prints; empty for ids plain text never contains (left out by XGrammar). */
  readonly tokens: readonly Uint8Array[];
  /** Ids that end a generation: allowed by a mask exactly where the grammar may end. */
  readonly stopIds: readonly number[];
  /** Logits per row (the model's vocabulary, which may be padded past the tokenizer's). */
  readonly vocabSize: number;
}

const NONE = new Uint8Array(0);

/**
 * The bytes every token decodes to, as our tokenizer decodes them (byte-level BPE's GPT-2
 * characters and SentencePiece's "▁" and `<0xXX>` pieces already turned into bytes), so a mask
 * that allows a token allows exactly the bytes it will print. Control, user-defined, unknown and
 * unused tokens, and padding ids past the tokenizer, are empty: XGrammar never allows those,
 * except the end-of-generation ids it is told are stop tokens.
 */
export function grammarVocabulary(tokenizer: Tokenizer, vocabSize: number): GrammarVocabulary {
  const tokens: Uint8Array[] = new Array(vocabSize);
  for (let id = 0; id < vocabSize; id++) {
    tokens[id] = id < tokenizer.vocabSize && !tokenizer.isSpecial(id)
      ? tokenizer.tokenBytes(id)
      : NONE;
  }
  const stopIds = [...tokenizer.eogIds].filter((id) => id < vocabSize).sort((a, b) => a - b);
  return { tokens, stopIds, vocabSize };
}
