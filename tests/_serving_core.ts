import { assertEquals } from "@std/assert";
import type { ServingCore } from "../actors/core.ts";

/**
 * Closes a serving core and fails the test if its engine restarted. A restart without injected
 * faults means the scheduler sent a plan the engine refused (a scheduler/engine disagreement):
 * recompute hides it from the tokens, so only this count shows it.
 */
export async function closeCore(core: ServingCore, expectedRestarts = 0): Promise<void> {
  await core.close();
  assertEquals(
    core.executor.restarts,
    expectedRestarts,
    `the engine restarted ${core.executor.restarts} times; expected ${expectedRestarts}`,
  );
}
