/**
 * GPT-2's reversible byte ↔ character mapping, which byte-level BPE vocabularies are spelled in:
 * printable Latin-1 bytes stand for themselves, the other 68 (controls, space, 0x7F-0xA0, 0xAD)
 * become U+0100 onwards in byte order, so a space is "Ġ" (U+0120) and "\n" is "Ċ" (U+010A).
 */
export const BYTE_TO_CHAR: readonly string[] = (() => {
  const out: string[] = new Array(256);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
    out[b] = String.fromCharCode(printable ? b : 256 + n++);
  }
  return out;
})();

/** The inverse of BYTE_TO_CHAR by UTF-16 code unit; -1 for characters that stand for no byte. */
export const CHAR_TO_BYTE: Int16Array = (() => {
  const out = new Int16Array(512).fill(-1);
  BYTE_TO_CHAR.forEach((ch, b) => (out[ch.charCodeAt(0)] = b));
  return out;
})();

const ENCODER = new TextEncoder();

/** A string's UTF-8 bytes spelled as GPT-2 characters. */
export function bytesToChars(text: string): string {
  const bytes = ENCODER.encode(text);
  let s = "";
  for (let i = 0; i < bytes.length; i++) s += BYTE_TO_CHAR[bytes[i]!]!;
  return s;
}

/** A piece spelled in GPT-2 characters back to its bytes; undefined if it has a character that stands for no byte. */
export function charsToBytes(piece: string): Uint8Array | undefined {
  const out = new Uint8Array(piece.length);
  for (let i = 0; i < piece.length; i++) {
    const c = piece.charCodeAt(i);
    const b = c < 512 ? CHAR_TO_BYTE[c]! : -1;
    if (b < 0) return undefined;
    out[i] = b;
  }
  return out;
}
