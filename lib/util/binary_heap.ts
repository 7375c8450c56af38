/**
 * A binary heap ordered by `before(a, b)` (true when a must come out first). Written here
 * rather than taken from @std/data-structures because the npm build of deno-std this project
 * can reach ships no type declarations, and both BPE encoders pop it on their hot path.
 */
export class BinaryHeap<T> {
  readonly #a: T[] = [];

  constructor(private readonly before: (a: T, b: T) => boolean) {}

  get size(): number {
    return this.#a.length;
  }

  push(value: T): void {
    const a = this.#a;
    a.push(value);
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!this.before(a[i]!, a[p]!)) break;
      [a[i], a[p]] = [a[p]!, a[i]!];
      i = p;
    }
  }

  /** The first value by `before`, removed; undefined when empty. */
  pop(): T | undefined {
    const a = this.#a;
    const top = a[0];
    const last = a.pop();
    if (a.length > 0 && last !== undefined) {
      a[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let best = i;
        if (l < a.length && this.before(a[l]!, a[best]!)) best = l;
        if (r < a.length && this.before(a[r]!, a[best]!)) best = r;
        if (best === i) break;
        [a[i], a[best]] = [a[best]!, a[i]!];
        i = best;
      }
    }
    return top;
  }
}
