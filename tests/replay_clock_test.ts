import { assertEquals, assertThrows } from "@std/assert";
import { logicalClock } from "../bench/replay_clock.ts";

Deno.test("logicalClock() advances by steps, and waiting for an arrival only moves it forward", async () => {
  const c = logicalClock(5);
  assertEquals(c.now(), 0);
  c.stepped();
  c.stepped();
  assertEquals(c.now(), 10);
  await c.until(4); // already past: time does not go back
  assertEquals(c.now(), 10);
  await c.until(23);
  assertEquals(c.now(), 23);
  c.stepped();
  assertEquals(c.now(), 28);
  assertThrows(() => logicalClock(0), Error, "received 0");
});
