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
  const heap = new RankHeap();
  const consider = (left: number, right: number) => {
    if (left < 0 || right < 0) return;
    const rank = ranks.rank(text[left]!, text[right]!);
    if (rank >= 0) heap.push(rank, left, right, version[left]!, version[right]!);
  };
  for (let i = 0; i + 1 < n; i++) consider(i, i + 1);

  while (heap.size > 0) {
    const { left, right, leftVersion, rightVersion } = heap.pop();
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

/** Min-heap on (rank, left). */
class RankHeap {
  readonly #a: Entry[] = [];

  get size(): number {
    return this.#a.length;
  }

  push(rank: number, left: number, right: number, leftVersion: number, rightVersion: number) {
    const a = this.#a;
    a.push({ rank, left, right, leftVersion, rightVersion });
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!first(a[i]!, a[p]!)) break;
      [a[i], a[p]] = [a[p]!, a[i]!];
      i = p;
    }
  }

  pop(): Entry {
    const a = this.#a;
    const top = a[0]!;
    const last = a.pop()!;
    if (a.length > 0) {
      a[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let best = i;
        if (l < a.length && first(a[l]!, a[best]!)) best = l;
        if (r < a.length && first(a[r]!, a[best]!)) best = r;
        if (best === i) break;
        [a[i], a[best]] = [a[best]!, a[i]!];
        i = best;
      }
    }
    return top;
  }
}

function first(x: Entry, y: Entry): boolean {
  return x.rank < y.rank || (x.rank === y.rank && x.left < y.left);
}
