/**
 * Bounds of a float request field that the engines hold as a 32-bit float (sampling
 * parameters, penalties, logit biases). JSON numbers are doubles: `1e-300` passes `> 0` as a
 * double and is 0 as an f32, where the repetition penalty then divides by zero. So each bound
 * is checked on the value and on `Math.fround` of it: what the engine will see.
 */
export interface F32Bounds {
  /** Exclusive lower bound. */
  readonly gt?: number;
  /** Inclusive lower bound. */
  readonly min?: number;
  /** Inclusive upper bound. */
  readonly max?: number;
}

/**
 * Why `v` breaks `b` once rounded to f32 (its double value within them), or undefined.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * assertEquals(
 *   f32Problem(1e-300, { gt: 0 }),
 *   "expected a number > 0 as a 32-bit float, the precision the engine computes in " +
 *     "(1e-300 rounds to 0)",
 * );
 * assertEquals(f32Problem(1e39, {})?.endsWith("(1e+39 rounds to Infinity)"), true);
 * assertEquals(f32Problem(1.5, { gt: 0, max: 2 }), undefined);
 * ```
 */
export function f32Problem(v: number, b: F32Bounds): string | undefined {
  const f = Math.fround(v);
  const why = (expected: string) =>
    Object.is(f, v) || Number.isNaN(v)
      ? `expected ${expected}`
      : `expected ${expected} as a 32-bit float, the precision the engine computes in ` +
        `(${v} rounds to ${f})`;
  if (!Number.isFinite(f)) return why("a finite number");
  // The bounds are f32 in the engine too: 1e-6 is compared as the f32 nearest it.
  const f32 = Math.fround;
  if (b.gt !== undefined && !(f > f32(b.gt))) return why(`a number > ${b.gt}`);
  if (b.min !== undefined && !(f >= f32(b.min))) return why(`a number >= ${b.min}`);
  if (b.max !== undefined && !(f <= f32(b.max))) return why(`a number <= ${b.max}`);
  return undefined;
}
