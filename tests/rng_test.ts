import { assert, assertEquals, assertNotEquals } from "@std/assert";
import { hash32, seedToU32, uniform } from "../lib/util/rng.ts";

Deno.test("uniform() is a pure function of seed and counter, in [0, 1) with 24 bits", () => {
  // Computed outside this project: the same mixing steps in Python's arbitrary-precision
  // integers, masked to 32 bits after every multiply (a check on JS's imul/>>> semantics).
  const known: Array<[number, number]> = [[0, 13588354], [1, 9353240], [2, 10382664], [
    999,
    10894170,
  ]];
  for (const [counter, top24] of known) assertEquals(uniform(7, counter), top24 / 16777216);
  for (let i = 0; i < 1000; i++) {
    const u = uniform(7, i);
    assert(u >= 0 && u < 1);
    assertEquals(u * 16777216, Math.floor(u * 16777216), "a multiple of 2^-24");
  }
  assertNotEquals(uniform(7, 0), uniform(8, 0));
});

Deno.test("seedToU32() keeps 32-bit seeds and tells apart seeds that differ above bit 31", () => {
  assertEquals(seedToU32(0), 0);
  assertEquals(seedToU32(123456789), 123456789);
  assertEquals(seedToU32(2 ** 32 - 1), 2 ** 32 - 1);
  const wide = [1 + 2 ** 32, -1, 2 ** 53 - 1, -(2 ** 53), 2 ** 40];
  const mapped = wide.map(seedToU32);
  for (const m of mapped) assert(Number.isInteger(m) && m >= 0 && m < 2 ** 32, `${m} is not a u32`);
  assertNotEquals(seedToU32(1 + 2 ** 32), seedToU32(1), "2^32+1 must not alias 1");
  assertNotEquals(seedToU32(-1), seedToU32(2 ** 32 - 1), "-1 must not alias 2^32-1");
  assertEquals(new Set(mapped).size, wide.length);
  // The folded values, computed the same way in Python (see above).
  assertEquals([2 ** 40, -1, 1 + 2 ** 32].map(seedToU32), [3088433053, 2813896863, 3863514558]);
});

Deno.test("hash32() spreads neighbouring counters (about half the bits flip)", () => {
  let flips = 0;
  for (let i = 0; i < 256; i++) {
    let x = (hash32(1, i) ^ hash32(1, i + 1)) >>> 0;
    while (x) {
      flips += x & 1;
      x >>>= 1;
    }
  }
  const mean = flips / 256;
  assert(mean > 12 && mean < 20, `mean bit flips ${mean}`);
});
