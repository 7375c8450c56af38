/**
 * Counter-based random numbers: the draw for a token is a pure function of the sequence's
 * seed and the token's position, so a recomputed or re-batched sequence draws the same
 * numbers. Only 32-bit integer multiply, xor and shift are used, so WGSL computes the same
 * bits (WGSL_RNG in kernels/webgpu/sample.ts mirrors this function).
 */
export function hash32(seed: number, counter: number): number {
  let h = (seed ^ Math.imul(counter, 0x9e3779b9)) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b) >>> 0;
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35) >>> 0;
  h = (h ^ (h >>> 16)) >>> 0;
  // A second round decorrelates neighbouring counters under the same seed.
  h = Math.imul(h ^ (h >>> 15), 0x2c1b3c6d) >>> 0;
  h = Math.imul(h ^ (h >>> 12), 0x297a2d39) >>> 0;
  return (h ^ (h >>> 15)) >>> 0;
}

/** Uniform draw in [0, 1) with 24 bits, exactly representable in f32. */
export function uniform(seed: number, counter: number): number {
  return (hash32(seed, counter) >>> 8) / 16777216;
}

/**
 * Maps any integer seed a client may send (JSON allows ±2^53) to the 32 bits the RNG uses.
 * Seeds in 0..2^32-1 are kept as they are; others fold their high bits and sign in, so seeds
 * that differ only above bit 31 (1 and 2^32+1, -1 and 2^32-1) draw differently.
 */
export function seedToU32(seed: number): number {
  if (seed >= 0 && seed < 2 ** 32) return seed >>> 0;
  const lo = Number(BigInt.asUintN(32, BigInt(seed)));
  const hi = Number(BigInt.asIntN(32, BigInt(seed) >> 32n));
  return hash32(lo, hi ^ 0x5bd1e995);
}
