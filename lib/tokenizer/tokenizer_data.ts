/** What a SentencePiece-style vocabulary file provides, before any tokenizer logic. */
export interface TokenizerData {
  /** Token pieces as the file spells them (SentencePiece files use "▁" for a space; byte pieces look like "<0x0A>"). */
  readonly tokens: readonly string[];
  readonly scores: Float32Array;
  /** SentencePiece token types (1 normal, 2 unknown, 3 control, 6 byte) where the file has them. */
  readonly tokenTypes?: Int32Array;
  readonly bosId: number;
  readonly eosId: number;
}
