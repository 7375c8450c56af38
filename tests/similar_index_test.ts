/**
 * The similar-question index against a plain oracle: the best cosine of the same context,
 * found by an exhaustive float64 scan of what a list kept (with the same LRU rule).
 */
import { assert, assertAlmostEquals, assertEquals, assertThrows } from "@std/assert";
import { SimilarIndex } from "../lib/core/similar_index.ts";
import { seededRandom } from "../lib/util/seeded_random.ts";

function unit(random: () => number, dim: number): Float32Array {
  const v = Float32Array.from({ length: dim }, () => random() - 0.5);
  const n = Math.hypot(...v);
  return v.map((x) => x / n);
}

const dot = (a: Float32Array, b: Float32Array) => a.reduce((s, x, i) => s + x * b[i]!, 0);

Deno.test("SimilarIndex finds the nearest vector of the same context, as an exhaustive scan does", () => {
  const random = seededRandom(11);
  const dim = 16;
  const index = new SimilarIndex<number>(dim, 1 << 30, () => 8);
  const kept: { context: string; v: Float32Array; id: number }[] = [];
  for (let i = 0; i < 500; i++) {
    const context = `ctx${i % 7}`;
    const v = unit(random, dim);
    index.add(context, v, i);
    kept.push({ context, v, id: i });
  }
  for (let q = 0; q < 50; q++) {
    const context = `ctx${q % 8}`; // ctx7 holds nothing
    const v = unit(random, dim);
    const got = index.nearest(context, v);
    const same = kept.filter((k) => k.context === context);
    if (same.length === 0) {
      assertEquals(got, undefined);
      continue;
    }
    const best = same.reduce((a, b) => (dot(b.v, v) > dot(a.v, v) ? b : a));
    assertEquals(got!.payload, best.id);
    assertAlmostEquals(got!.score, dot(best.v, v), 1e-5);
  }
});

Deno.test("SimilarIndex stays within its bytes, dropping the least recently used entry first", () => {
  const random = seededRandom(5);
  const dim = 8;
  const per = dim * 4 + 2 * "c".length + 10 + 160;
  const index = new SimilarIndex<string>(dim, 3 * per, () => 10);
  const vs = [0, 1, 2, 3].map(() => unit(random, dim));
  index.add("c", vs[0]!, "a");
  index.add("c", vs[1]!, "b");
  index.add("c", vs[2]!, "c");
  assertEquals([index.size, index.bytes], [3, 3 * per]);
  // Using "a" makes "b" the oldest: the fourth entry drops "b".
  assertEquals(index.nearest("c", vs[0]!)!.payload, "a");
  index.add("c", vs[3]!, "d");
  assertEquals(index.size, 3);
  assert(index.bytes <= 3 * per);
  assertEquals(index.nearest("c", vs[1]!)!.payload === "b", false);
  for (const [i, p] of [[0, "a"], [2, "c"], [3, "d"]] as const) {
    const m = index.nearest("c", vs[i]!)!;
    assertEquals(m.payload, p);
    assertAlmostEquals(m.score, 1, 1e-6);
  }
  // An entry larger than the whole capacity is not kept, and drops nothing.
  new SimilarIndex<string>(dim, 100, () => 10).add("c", vs[0]!, "x");
  assertThrows(() => index.nearest("c", new Float32Array(3)), RangeError, "3 values");
});
