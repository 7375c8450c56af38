import { ByteStrings } from "../util/byte_strings.ts";

/**
 * BPE merge ranks looked up by the pair's text ("Ġ" + " " + "t"), over the merges' UTF-8 bytes
 * in an open-addressing hash table: building it touches no JavaScript strings, which for a
 * Llama 3 vocabulary (280k merges) is the difference between tens and hundreds of
 * milliseconds. The first of duplicated merges keeps its rank, as in llama.cpp.
 */
export class MergeRanks {
  readonly #merges: ByteStrings;
  /** Merge index + 1 at each slot, 0 for empty. */
  readonly #table: Int32Array;
  readonly #mask: number;
  readonly size: number;
  #scratch = new Uint8Array(256);

  constructor(merges: readonly string[] | ByteStrings) {
    const m = merges instanceof ByteStrings ? merges : ByteStrings.from(merges);
    this.#merges = m;
    const n = m.length;
    let cap = 16;
    while (cap < n * 2) cap *= 2;
    this.#table = new Int32Array(cap);
    this.#mask = cap - 1;
    const { bytes, offsets } = m;
    let size = 0;
    for (let i = 0; i < n; i++) {
      const start = offsets[i]!;
      const end = offsets[i + 1]!;
      let slot = fnv1a(bytes, start, end) & this.#mask;
      for (;;) {
        const at = this.#table[slot]!;
        if (at === 0) {
          this.#table[slot] = i + 1;
          size++;
          break;
        }
        if (sameBytes(bytes, offsets[at - 1]!, offsets[at]!, bytes, start, end)) break;
        slot = (slot + 1) & this.#mask;
      }
    }
    this.size = size;
  }

  /** The rank of merging `left` and `right`, or -1 when they do not merge. */
  rank(left: string, right: string): number {
    let len = 0;
    const need = (left.length + right.length) * 3 + 1;
    if (need > this.#scratch.length) this.#scratch = new Uint8Array(need * 2);
    const buf = this.#scratch;
    len = utf8Into(left, buf, 0);
    buf[len++] = 0x20;
    len = utf8Into(right, buf, len);
    const { bytes, offsets } = this.#merges;
    let slot = fnv1a(buf, 0, len) & this.#mask;
    for (;;) {
      const at = this.#table[slot]!;
      if (at === 0) return -1;
      if (sameBytes(bytes, offsets[at - 1]!, offsets[at]!, buf, 0, len)) return at - 1;
      slot = (slot + 1) & this.#mask;
    }
  }
}

function fnv1a(b: Uint8Array, start: number, end: number): number {
  let h = 0x811c9dc5;
  for (let i = start; i < end; i++) h = Math.imul(h ^ b[i]!, 0x01000193);
  return h >>> 0;
}

function sameBytes(
  a: Uint8Array,
  aStart: number,
  aEnd: number,
  b: Uint8Array,
  bStart: number,
  bEnd: number,
): boolean {
  if (aEnd - aStart !== bEnd - bStart) return false;
  for (let i = 0; i < aEnd - aStart; i++) if (a[aStart + i] !== b[bStart + i]) return false;
  return true;
}

/** Writes `s` as UTF-8 at `at` (lone surrogates as U+FFFD, like TextEncoder); returns the end. */
function utf8Into(s: string, out: Uint8Array, at: number): number {
  for (let i = 0; i < s.length; i++) {
    let c = s.charCodeAt(i);
    if (c < 0x80) {
      out[at++] = c;
    } else if (c < 0x800) {
      out[at++] = 0xc0 | (c >> 6);
      out[at++] = 0x80 | (c & 0x3f);
    } else {
      if (c >= 0xd800 && c < 0xe000) {
        const d = s.charCodeAt(i + 1);
        if (c < 0xdc00 && d >= 0xdc00 && d < 0xe000) {
          c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
          i++;
          out[at++] = 0xf0 | (c >> 18);
          out[at++] = 0x80 | ((c >> 12) & 0x3f);
          out[at++] = 0x80 | ((c >> 6) & 0x3f);
          out[at++] = 0x80 | (c & 0x3f);
          continue;
        }
        c = 0xfffd;
      }
      out[at++] = 0xe0 | (c >> 12);
      out[at++] = 0x80 | ((c >> 6) & 0x3f);
      out[at++] = 0x80 | (c & 0x3f);
    }
  }
  return at;
}
