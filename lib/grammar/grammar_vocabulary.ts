import type { Tokenizer } from "../tokenizer/tokenizer.ts";

/**
 * A vocabulary as XGrammar's TokenizerInfo takes it in its "raw" mode, packed: every token's
 * bytes one after the other in `bytes`, token `id` at `bytes[offsets[id]..offsets[id + 1]]`.
 * Both live in SharedArrayBuffers, so every grammar worker reads the same ~1 MiB (151,936 Qwen
 * tokens) instead of a structured clone of 151k arrays each (measured: +122 MiB per worker).
 */
export interface GrammarVocabulary {
  /** Each id's bytes as it prints; empty for ids plain text never contains (left out by XGrammar). */
  readonly bytes: Uint8Array;
  /** `vocabSize + 1` offsets into `bytes`. */
  readonly offsets: Uint32Array;
  /** Ids that end a generation: allowed by a mask exactly where the grammar may end. */
  readonly stopIds: readonly number[];
  /** Logits per row (the model's vocabulary, which may be padded past the tokenizer's). */
  readonly vocabSize: number;
}

/**
 * The bytes every token decodes to, as our tokenizer decodes them (byte-level BPE's GPT-2
 * characters and SentencePiece's "▁" and `<0xXX>` pieces already turned into bytes), so a mask
 * that allows a token allows exactly the bytes it will print. Control, user-defined, unknown and
 * unused tokens, and padding ids past the tokenizer, are empty: XGrammar never allows those,
 * except the end-of-generation ids it is told are stop tokens.
 */
export function grammarVocabulary(tokenizer: Tokenizer, vocabSize: number): GrammarVocabulary {
  const packing = pack(tokenizer, vocabSize);
  let step = packing.next();
  while (!step.done) step = packing.next();
  return step.value;
}

/**
 * grammarVocabulary in slices of `slice` tokens with the event loop free between them: 150k
 * tokens take 0.1-0.4 s, which a server that has just said it is ready should not stall for.
 */
export async function grammarVocabularyInSlices(
  tokenizer: Tokenizer,
  vocabSize: number,
  slice = 8192,
): Promise<GrammarVocabulary> {
  const packing = pack(tokenizer, vocabSize, slice);
  let step = packing.next();
  while (!step.done) {
    await new Promise((resolve) => setTimeout(resolve, 0));
    step = packing.next();
  }
  return step.value;
}

/** Packs the vocabulary, pausing (a yield) after every `slice` tokens. */
function* pack(
  tokenizer: Tokenizer,
  vocabSize: number,
  slice = Infinity,
): Generator<void, GrammarVocabulary> {
  const offsets = new Uint32Array(new SharedArrayBuffer(4 * (vocabSize + 1)));
  let packed = new Uint8Array(8 * vocabSize);
  let total = 0;
  for (let id = 0; id < vocabSize; id++) {
    if (id > 0 && id % slice === 0) yield;
    offsets[id] = total;
    if (id >= tokenizer.vocabSize || tokenizer.isSpecial(id)) continue;
    const token = tokenizer.tokenBytes(id, false);
    if (total + token.length > packed.length) {
      const grown = new Uint8Array(2 * (total + token.length));
      grown.set(packed.subarray(0, total));
      packed = grown;
    }
    packed.set(token, total);
    total += token.length;
  }
  offsets[vocabSize] = total;
  const bytes = new Uint8Array(new SharedArrayBuffer(total));
  bytes.set(packed.subarray(0, total));
  const stopIds = [...tokenizer.eogIds].filter((id) => id < vocabSize).sort((a, b) => a - b);
  return { bytes, offsets, stopIds, vocabSize };
}

/** Token `id`'s bytes (a view into the vocabulary, no copy). */
export function tokenBytes(vocab: GrammarVocabulary, id: number): Uint8Array {
  return vocab.bytes.subarray(vocab.offsets[id]!, vocab.offsets[id + 1]!);
}

/** Bytes of the vocabulary's longest token: what one token can write at most. */
export function longestToken(vocab: GrammarVocabulary): number {
  let n = 1;
  for (let id = 0; id < vocab.vocabSize; id++) {
    n = Math.max(n, vocab.offsets[id + 1]! - vocab.offsets[id]!);
  }
  return n;
}
