import { mergeAdjacent } from "./adjacent_merge.ts";

/**
 * Byte-level BPE merging of one pre-tokenized word: starting from single characters, repeatedly
 * merge the adjacent pair with the lowest merge rank (leftmost among equal ranks, as llama.cpp's
 * queue orders them) until no adjacent pair has a rank.
 */
export function mergeWord(
  chars: readonly string[],
  ranks: { rank(left: string, right: string): number },
): string[] {
  if (chars.length < 2) return [...chars];
  const text = [...chars];
  const kept = mergeAdjacent<number>(
    text.length,
    (left, right) => {
      const rank = ranks.rank(text[left]!, text[right]!);
      return rank >= 0 ? rank : undefined;
    },
    (a, b) => a < b,
    (left, right) => text[left] += text[right]!,
  );
  return kept.map((i) => text[i]!);
}
