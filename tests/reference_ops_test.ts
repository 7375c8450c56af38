import { assert, assertAlmostEquals, assertEquals, assertThrows } from "@std/assert";
import {
  addInPlace,
  matvec,
  rmsnorm,
  rope,
  silu,
  softmax,
  swiglu,
} from "../kernels/reference/ops.ts";
import { pagedAttention } from "../kernels/reference/paged_attention.ts";
import { PagedKvCache } from "../kernels/reference/paged_kv_cache.ts";

const f32 = (xs: number[]) => new Float32Array(xs);

function assertClose(actual: ArrayLike<number>, expected: number[], tol = 1e-6) {
  assertEquals(actual.length, expected.length);
  expected.forEach((e, i) =>
    assertAlmostEquals(actual[i]!, e, tol, `element ${i}: ${actual[i]} vs ${e}`)
  );
}

Deno.test("rmsnorm() divides by the root mean square and scales by the weight", () => {
  // mean(9, 16) = 12.5, rms = 3.5355339
  assertClose(rmsnorm(new Float32Array(2), f32([3, 4]), f32([1, 2]), 0), [
    3 / 3.5355339,
    8 / 3.5355339,
  ]);
  // eps enters under the root: mean 0 + 0.25 -> divide by 0.5
  assertClose(rmsnorm(new Float32Array(2), f32([0, 0]), f32([1, 1]), 0.25), [0, 0]);
  assertClose(rmsnorm(new Float32Array(1), f32([1]), f32([1]), 3), [0.5]);
  assertThrows(
    () => rmsnorm(new Float32Array(2), f32([1, 2]), f32([1]), 0),
    Error,
    "received 2, 1 and 2",
  );
});

Deno.test("matvec() multiplies a row-major [out, in] matrix by a vector", () => {
  assertClose(matvec(new Float32Array(3), f32([1, 2, 3, 4, 5, 6]), f32([2, 1])), [4, 10, 16]);
  assertThrows(
    () => matvec(new Float32Array(3), f32([1, 2, 3, 4]), f32([2, 1])),
    Error,
    "expected 3 x 2 = 6",
  );
});

Deno.test("rope() rotates adjacent pairs by pos * theta^(-2i/ropeDim) in every head", () => {
  // headDim 4: pair 0 turns by pos rad, pair 1 by pos * 10000^(-1/2) = pos / 100 rad.
  const v = f32([1, 0, 0, 1, 1, 0, 0, 1]);
  rope(v, 2, 4, 4, 1, 10000);
  const head = [Math.cos(1), Math.sin(1), -Math.sin(0.01), Math.cos(0.01)];
  assertClose(v, [...head, ...head]);

  const at3 = rope(f32([2, 1, 1, 0]), 1, 4, 4, 3, 10000);
  assertClose(at3, [
    2 * Math.cos(3) - Math.sin(3),
    2 * Math.sin(3) + Math.cos(3),
    Math.cos(0.03),
    Math.sin(0.03),
  ]);
});

Deno.test("rope() leaves position 0 and dimensions past ropeDim unchanged", () => {
  assertClose(rope(f32([0.5, -2, 3, 4]), 1, 4, 4, 0, 10000), [0.5, -2, 3, 4]);
  // ropeDim 2: only pair 0 turns, with theta^0 = 1.
  assertClose(rope(f32([1, 0, 5, 6]), 1, 4, 2, 2, 500000), [Math.cos(2), Math.sin(2), 5, 6]);
  assertThrows(
    () => rope(f32([1, 2, 3]), 1, 4, 4, 0, 10000),
    Error,
    "vector of 3 must be 1 heads x 4",
  );
});

Deno.test("silu() and swiglu() equal x * sigmoid(x), gated by up", () => {
  assertEquals(silu(0), 0);
  assertAlmostEquals(silu(1), 0.7310585786, 1e-9);
  assertAlmostEquals(silu(-1), -0.2689414214, 1e-9);
  assertClose(swiglu(f32([1, -1, 0]), f32([2, 3, 4])), [2 * 0.7310585786, 3 * -0.2689414214, 0]);
});

Deno.test("softmax() normalises exponentials, over a prefix when asked", () => {
  assertClose(softmax(f32([0, Math.log(3)])), [0.25, 0.75]);
  assertClose(softmax(f32([1000, 1000])), [0.5, 0.5]);
  assertClose(softmax(f32([0, 0, 7]), 2), [0.5, 0.5, 7]);
});

Deno.test("addInPlace() adds the residual", () => {
  assertClose(addInPlace(f32([1, 2]), f32([0.5, -2])), [1.5, 0]);
});

Deno.test("PagedKvCache.slotOffset() maps a position through the block table", () => {
  const kv = new PagedKvCache(1, 2, 4, { numBlocks: 10, blockSize: 4 });
  assertEquals(kv.rowSize, 8);
  assertEquals(kv.key(0).length, 10 * 4 * 8);
  assertEquals(kv.slotOffset([7, 2], 0), 7 * 4 * 8);
  assertEquals(kv.slotOffset([7, 2], 6), (2 * 4 + 2) * 8);
  assertThrows(
    () => kv.slotOffset([7, 2], 8),
    Error,
    "position 8 needs entry 2 of a block table of 2",
  );
  assertThrows(() => kv.slotOffset([7, 10], 5), Error, "received 10");
});

/** Writes K/V rows (one array of heads per position) at the slots a block table names. */
function fill(kv: PagedKvCache, table: number[], keys: number[][], values: number[][]) {
  keys.forEach((k, t) => kv.key(0).set(k, kv.slotOffset(table, t)));
  values.forEach((v, t) => kv.value(0).set(v, kv.slotOffset(table, t)));
}

Deno.test("pagedAttention() weights values by softmax(q·k / sqrt(headDim)) through the block table", () => {
  const kv = new PagedKvCache(1, 1, 2, { numBlocks: 4, blockSize: 1 });
  const table = [3, 1, 0];
  fill(kv, table, [[1, 0], [0, 1], [9, 9]], [[1, 2], [3, 4], [100, 100]]);
  // scores 0 and ln 3 -> weights 1/4, 3/4; position 2 is in the future and must be ignored.
  const q = f32([0, Math.SQRT2 * Math.log(3)]);
  assertClose(pagedAttention(new Float32Array(2), q, kv, 0, table, 1, 1), [2.5, 3.5], 1e-5);
  // At position 0 only the first row is visible.
  assertClose(pagedAttention(new Float32Array(2), q, kv, 0, table, 0, 1), [1, 2]);
});

Deno.test("pagedAttention() shares each KV head across its group of query heads", () => {
  // 4 query heads, 2 KV heads, one position: every head returns its KV head's value row.
  const kv = new PagedKvCache(1, 2, 2, { numBlocks: 2, blockSize: 2 });
  fill(kv, [1], [[1, 1, 1, 1]], [[10, 11, 20, 21]]);
  const out = pagedAttention(new Float32Array(8), f32([1, 2, 3, 4, 5, 6, 7, 8]), kv, 0, [1], 0, 4);
  assertClose(out, [10, 11, 10, 11, 20, 21, 20, 21]);
});

Deno.test("PagedKvCache.release() hands its pools, zeroed, to the next cache of the same shape only", () => {
  const geometry = { numBlocks: 6, blockSize: 4 };
  const a = new PagedKvCache(2, 2, 4, geometry);
  a.key(1).fill(7);
  const pools = [a.key(0), a.key(1), a.value(0), a.value(1)];
  a.release();
  const other = new PagedKvCache(2, 2, 8, geometry);
  assert(pools.every((p) => p !== other.key(0)), "another shape gets new pools");
  const b = new PagedKvCache(2, 2, 4, geometry);
  assertEquals([b.key(0), b.key(1), b.value(0), b.value(1)], pools);
  assert(pools[1] === b.key(1) && b.key(1).every((x) => x === 0), "reused and zeroed");
  const c = new PagedKvCache(2, 2, 4, geometry);
  assert(c.key(0) !== b.key(0), "a live cache's pools are never shared");
});
