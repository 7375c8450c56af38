/**
 * Client text inside chat-template text. A template's own control-token text ("<|im_start|>")
 * is meant as tokens, while the same characters in a message a client sent must stay
 * characters. The chat renderer marks the client's text before rendering: a noncharacter
 * (Unicode sets U+FDD0 aside for a program's internal use) goes inside every special-token
 * spelling there, so the tokenizer finds no special token in it, and is removed again before
 * the text is encoded. A mark the client sent itself is doubled, so it comes through unchanged.
 * Only the mark is added, so templates that trim or compare message content still work, except
 * where a template looks for a special token inside content (Qwen3 splitting an assistant
 * message at "</think>"): such text now reads as the client's.
 */
export const LITERAL_MARK = "\uFDD0";

/** Marks `text` so that none of `specialPieces` (of two characters or more) can be found in it. */
export function protectLiteral(text: string, specialPieces: readonly string[]): string {
  let out = text.replaceAll(LITERAL_MARK, LITERAL_MARK + LITERAL_MARK);
  for (const piece of specialPieces) {
    const chars = [...piece];
    if (chars.length < 2 || !out.includes(piece)) continue;
    out = out.replaceAll(piece, chars[0] + LITERAL_MARK + chars.slice(1).join(""));
  }
  return out;
}

/** Undoes protectLiteral on a run of text between special tokens. */
export function unprotectLiteral(text: string): string {
  if (!text.includes(LITERAL_MARK)) return text;
  return text.replace(/\uFDD0\uFDD0|\uFDD0/g, (m) => (m.length === 2 ? LITERAL_MARK : ""));
}
