/**
 * Many short strings kept as their UTF-8 bytes laid end to end: string `i` is
 * `bytes[offsets[i] .. offsets[i + 1])`. A vocabulary's 280k BPE merges are only ever looked up,
 * so they need never become 280k JavaScript strings (whose creation and hashing would be most
 * of a vocabulary's load time).
 */
export class ByteStrings {
  constructor(readonly bytes: Uint8Array, readonly offsets: Uint32Array) {
    if (offsets.length === 0 || offsets[offsets.length - 1] !== bytes.length) {
      throw new RangeError(
        `ByteStrings: the last offset must be the byte length ${bytes.length}, received ${
          offsets.at(-1)
        }`,
      );
    }
  }

  get length(): number {
    return this.offsets.length - 1;
  }

  /** String `i` decoded (for messages and tests; lookups work on the bytes). */
  get(i: number): string {
    return new TextDecoder().decode(this.bytes.subarray(this.offsets[i], this.offsets[i + 1]));
  }

  /** From JavaScript strings (e.g. a vocabulary built in code). */
  static from(strings: readonly string[]): ByteStrings {
    const enc = new TextEncoder();
    const parts = strings.map((s) => enc.encode(s));
    const offsets = new Uint32Array(strings.length + 1);
    for (let i = 0; i < parts.length; i++) offsets[i + 1] = offsets[i]! + parts[i]!.length;
    const bytes = new Uint8Array(offsets[strings.length]!);
    parts.forEach((p, i) => bytes.set(p, offsets[i]!));
    return new ByteStrings(bytes, offsets);
  }

  toString(): string {
    return `${this.length} strings`;
  }
}
