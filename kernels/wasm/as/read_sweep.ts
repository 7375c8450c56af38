// A plain streaming read of a memory range, the bound a decode step's weight reads can reach:
// the bench prints its bytes/s as the limit (issue 35). Four independent accumulators, 64 bytes
// an iteration, so the loop waits on memory and not on its own dependency chain.

/** XOR of the v128s in [p, p + n) (n a multiple of 64), stored at sink so it is not dropped. */
export function readSweep(p: usize, n: usize, sink: usize): void {
  let a = i32x4.splat(0), b = i32x4.splat(0), c = i32x4.splat(0), d = i32x4.splat(0);
  const end = p + n;
  for (let q = p; q < end; q += 64) {
    a = v128.xor(a, v128.load(q));
    b = v128.xor(b, v128.load(q, 16));
    c = v128.xor(c, v128.load(q, 32));
    d = v128.xor(d, v128.load(q, 48));
  }
  v128.store(sink, v128.xor(v128.xor(a, b), v128.xor(c, d)));
}
