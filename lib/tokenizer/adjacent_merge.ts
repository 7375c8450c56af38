import { BinaryHeap } from "../util/binary_heap.ts";

interface Candidate<K> {
  readonly key: K;
  readonly left: number;
  readonly right: number;
  readonly leftVersion: number;
  readonly rightVersion: number;
}

/**
 * The merge loop both BPE tokenizers share: n units in a row, repeatedly merge the best adjacent
 * pair (by `better`, the leftmost among equals) until no adjacent pair merges. A heap over a
 * linked list keeps it O(n log n) (a paragraph of CJK text is one word), yet it picks the same
 * pair as a full rescan each round, because list nodes keep their original positions in order
 * and stale heap entries are recognised by version stamps.
 *
 * `pairKey(left, right)` says how good merging those two units is now (undefined: never);
 * `merge(left, right, key)` folds unit `right` into unit `left`. Returns the surviving units'
 * indices in order.
 */
export function mergeAdjacent<K>(
  n: number,
  pairKey: (left: number, right: number) => K | undefined,
  better: (a: K, b: K) => boolean,
  merge: (left: number, right: number, key: K) => void,
): number[] {
  const next = new Int32Array(n);
  const prev = new Int32Array(n);
  const version = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  const heap = new BinaryHeap<Candidate<K>>((x, y) =>
    better(x.key, y.key) || (!better(y.key, x.key) && x.left < y.left)
  );
  const consider = (left: number, right: number) => {
    if (left < 0 || right < 0) return;
    const key = pairKey(left, right);
    if (key === undefined) return;
    heap.push({ key, left, right, leftVersion: version[left]!, rightVersion: version[right]! });
  };
  for (let i = 0; i + 1 < n; i++) consider(i, i + 1);

  for (let top = heap.pop(); top; top = heap.pop()) {
    const { left, right } = top;
    if (
      next[left] !== right || version[left] !== top.leftVersion ||
      version[right] !== top.rightVersion
    ) continue;
    merge(left, right, top.key);
    version[left]!++;
    version[right]!++;
    const after = next[right]!;
    next[left] = after;
    if (after >= 0) prev[after] = left;
    next[right] = -1;
    consider(prev[left]!, left);
    consider(left, after);
  }
  const out: number[] = [];
  for (let i = n > 0 ? 0 : -1; i >= 0; i = next[i]!) out.push(i);
  return out;
}
