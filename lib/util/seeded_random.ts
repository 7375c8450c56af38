/**
 * A seeded uniform generator on [0, 1) (mulberry32): the same seed gives the same sequence, so
 * random tests, fuzzing and benchmark workloads repeat exactly.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const a = seededRandom(42);
 * const b = seededRandom(42);
 * assertEquals([a(), a()], [b(), b()]); // the same draws for the same seed
 * ```
 */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
