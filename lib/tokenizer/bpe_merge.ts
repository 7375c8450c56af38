import { BinaryHeap } from "../util/binary_heap.ts";

/**
 * Byte-level BPE merging of one pre-tokenized word: starting from single characters, repeatedly
 * merge the adjacent pair with the lowest merge rank (leftmost among equal ranks, as llama.cpp's
 * queue orders them) until no adjacent pair has a rank. A heap over a linked list keeps a long
 * word (a paragraph of CJK text is one word) at O(n log n).
 */
export function mergeWord(
  chars: readonly string[],
  ranks: { rank(left: string, right: string): number },
): string[] {
  const n = chars.length;
  if (n < 2) return [...chars];
  const text = [...chars];
  const next = new Int32Array(n);
  const prev = new Int32Array(n);
  const version = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  // Lowest rank first, leftmost among equal ranks.
  const heap = new BinaryHeap<Entry>((x, y) =>
    x.rank < y.rank || (x.rank === y.rank && x.left < y.left)
  );
  const consider = (left: number, right: number) => {
    if (left < 0 || right < 0) return;
    const rank = ranks.rank(text[left]!, text[right]!);
    if (rank >= 0) {
      heap.push({ rank, left, right, leftVersion: version[left]!, rightVersion: version[right]! });
    }
  };
  for (let i = 0; i + 1 < n; i++) consider(i, i + 1);

  for (let top = heap.pop(); top; top = heap.pop()) {
    const { left, right, leftVersion, rightVersion } = top;
    if (
      next[left] !== right || version[left] !== leftVersion || version[right] !== rightVersion
    ) continue;
    text[left] += text[right]!;
    version[left]!++;
    version[right]!++;
    const after = next[right]!;
    next[left] = after;
    if (after >= 0) prev[after] = left;
    next[right] = -1;
    consider(prev[left]!, left);
    consider(left, after);
  }
  const out: string[] = [];
  for (let i = 0; i >= 0; i = next[i]!) out.push(text[i]!);
  return out;
}

interface Entry {
  rank: number;
  left: number;
  right: number;
  leftVersion: number;
  rightVersion: number;
}
