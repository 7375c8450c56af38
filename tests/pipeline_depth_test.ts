import { assertEquals, assertThrows } from "@std/assert";
import { depthFor, LATE_READBACK, PipelineDepth } from "../lib/core/pipeline_depth.ts";

Deno.test("depthFor() covers a step's busy time and the readback after it: 2 + ceil(L / busy), within min..max", () => {
  // 10 ms readback: 2 ms steps need 2 + 5, 4 ms steps 2 + 3, 9 ms 2 + 2, 30 ms 2 + 1 -> min 3.
  assertEquals([2, 4, 9, 30].map((d) => depthFor(10, d, 3, 8)), [7, 5, 4, 3]);
  assertEquals(depthFor(10, 0.5, 3, 8), 8, "never past max");
  assertEquals(depthFor(10, 0, 3, 8), 8, "a step that cost nothing measurable: the deepest");
});

Deno.test("PipelineDepth follows the smoothed busy time: deep for short steps, shallow for long ones", () => {
  const d = new PipelineDepth({ min: 3, max: 8, latencyMs: 10 });
  assertEquals([d.busyMs, d.current], [undefined, 8]);
  for (let i = 0; i < 20; i++) d.onResult(2);
  assertEquals([d.busyMs, d.current], [2, 7]);
  // One 40 ms prefill moves the estimate by a quarter of the difference: 2 + 9.5 -> 11.5 ms.
  d.onResult(40);
  assertEquals([d.busyMs, d.current], [11.5, 3]);
  for (let i = 0; i < 40; i++) d.onResult(9);
  assertEquals(d.current, 4);
  // Steps the engine does not time change nothing.
  d.onResult(undefined);
  d.onResult(Number.NaN);
  assertEquals(d.current, 4);
  d.reset();
  assertEquals([d.busyMs, d.current], [undefined, 8]);
});

Deno.test("PipelineDepth takes the readback latency its results measure over the engine's guess", () => {
  const d = new PipelineDepth({ min: 3, max: 8, latencyMs: 10 });
  d.onResult(4);
  assertEquals([d.readbackMs, d.current], [undefined, 5], "the guess: 2 + ceil(10 / 4)");
  // Readbacks of 14 ms: 2 + ceil(14 / 4) = 6 once measured.
  for (let i = 0; i < 10; i++) d.onResult(4, 14);
  assertEquals([d.readbackMs, d.current], [14, 6]);
  // Shorter readbacks than the guess lower it: 2 + ceil(6 / 4).
  for (let i = 0; i < 40; i++) d.onResult(4, 6);
  assertEquals(d.current, 4);
  // A latency without a busy time is no measurement of a step.
  d.onResult(undefined, 100);
  assertEquals(d.readbackMs?.toFixed(3), "6.000");
});

Deno.test("a readback later than LATE_READBACK times the engine's latency counts as that much: the host was late, not the device", () => {
  const d = new PipelineDepth({ min: 3, max: 16, latencyMs: 10 });
  for (let i = 0; i < 40; i++) d.onResult(4, 40);
  // Measured 40 ms, counted as 1.25 x 10: 2 + ceil(12.5 / 4) = 6, not 2 + ceil(40 / 4) = 12.
  assertEquals(LATE_READBACK, 1.25);
  assertEquals([Math.round(d.readbackMs!), d.current], [40, 6]);
});

Deno.test("PipelineDepth refuses bounds out of order and a negative latency, naming them", () => {
  assertThrows(
    () => new PipelineDepth({ min: 4, max: 3, latencyMs: 10 }),
    RangeError,
    "received min 4, max 3",
  );
  assertThrows(
    () => new PipelineDepth({ min: 1, max: 3, latencyMs: -1 }),
    RangeError,
    "latencyMs must be >= 0, received -1",
  );
});
