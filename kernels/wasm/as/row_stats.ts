// What greedy sampling needs of a row of logits (its first largest entry, and the log-softmax
// normaliser), computed by the threads right after the classifier: at 32 rows of a 150k
// vocabulary, Math.exp on the main thread took 30-50 ms a step.

/**
 * e^x for x ≤ 0 (Cephes' expf: range reduction by ln 2 in two parts, a degree-6 polynomial),
 * relative error under 2e-7; 0 below -87, so no result is ever subnormal (x86 takes a
 * microcode assist on those).
 */
// @ts-ignore: decorator
@inline function expNonPositive(x: v128): v128 {
  const xx = f32x4.max(x, f32x4.splat(-87));
  const n = f32x4.nearest(f32x4.mul(xx, f32x4.splat(1.44269504088896341)));
  let r = f32x4.sub(xx, f32x4.mul(n, f32x4.splat(0.693359375)));
  r = f32x4.sub(r, f32x4.mul(n, f32x4.splat(-2.12194440e-4)));
  let p = f32x4.splat(1.9875691500e-4);
  p = f32x4.add(f32x4.mul(p, r), f32x4.splat(1.3981999507e-3));
  p = f32x4.add(f32x4.mul(p, r), f32x4.splat(8.3334519073e-3));
  p = f32x4.add(f32x4.mul(p, r), f32x4.splat(4.1665795894e-2));
  p = f32x4.add(f32x4.mul(p, r), f32x4.splat(1.6666665459e-1));
  p = f32x4.add(f32x4.mul(p, r), f32x4.splat(5.0000001201e-1));
  p = f32x4.add(f32x4.add(f32x4.mul(f32x4.mul(p, r), r), r), f32x4.splat(1));
  const pow2 = i32x4.shl(i32x4.add(i32x4.trunc_sat_f32x4_s(n), i32x4.splat(127)), 23);
  return v128.and(f32x4.mul(p, pow2), f32x4.ge(x, f32x4.splat(-87)));
}

/**
 * For the V logits at p: writes at out the index of the first largest (i32), the largest
 * (f32), Σ e^(x − largest) (f32, summed in 4 lanes in index order, then as hsum does) and a
 * flag (i32) that is 1 when a logit is NaN or the largest is infinite, where the caller must
 * fall back to its own code.
 */
export function rowStats(p: usize, V: i32, out: usize): void {
  const V4 = V & ~3;
  let m = f32x4.splat(-Infinity);
  let nan = i32x4.splat(0);
  for (let i = 0; i < V4; i += 4) {
    const x = v128.load(p + (<usize>i << 2));
    nan = v128.or(nan, f32x4.ne(x, x));
    m = v128.bitselect(x, m, f32x4.gt(x, m));
  }
  let best = max(max(f32x4.extract_lane(m, 0), f32x4.extract_lane(m, 1)), max(f32x4.extract_lane(m, 2), f32x4.extract_lane(m, 3)));
  let bad = v128.any_true(nan);
  for (let i = V4; i < V; i++) {
    const x = load<f32>(p + (<usize>i << 2));
    if (x != x) bad = true;
    else if (x > best) best = x;
  }
  let at = 0;
  while (at < V && load<f32>(p + (<usize>at << 2)) != best) at++;
  if (best == Infinity || best == -Infinity) bad = true;
  let s = f32x4.splat(0);
  const bv = f32x4.splat(best);
  for (let i = 0; i < V4; i += 4) s = f32x4.add(s, expNonPositive(f32x4.sub(v128.load(p + (<usize>i << 2)), bv)));
  let sum = (f32x4.extract_lane(s, 0) + f32x4.extract_lane(s, 1)) + (f32x4.extract_lane(s, 2) + f32x4.extract_lane(s, 3));
  for (let i = V4; i < V; i++) {
    sum += f32x4.extract_lane(expNonPositive(f32x4.splat(load<f32>(p + (<usize>i << 2)) - best)), 0);
  }
  store<i32>(out, at);
  store<f32>(out, best, 4);
  store<f32>(out, sum, 8);
  store<i32>(out, bad ? 1 : 0, 12);
}
