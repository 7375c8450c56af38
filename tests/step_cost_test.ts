import { assertAlmostEquals, assertEquals } from "@std/assert";
import { StepCost } from "../lib/core/step_cost.ts";

Deno.test("StepCost fits a fixed and a per-row cost from the steps it saw", () => {
  const cost = new StepCost();
  for (const rows of [1, 2, 33, 5, 1, 100]) cost.observe(rows, 25 + 3 * rows);
  assertAlmostEquals(cost.fixedMs!, 25, 1e-6);
  assertAlmostEquals(cost.perRowMs!, 3, 1e-6);
  // Hand-computed: sqrt(25 × 300 / 3) = 50 rows a step.
  assertAlmostEquals(cost.burstRows(300), 50, 1e-6);
});

Deno.test("StepCost cuts nothing until it has seen enough steps of different sizes", () => {
  const cost = new StepCost();
  assertEquals(cost.burstRows(1000), Infinity, "nothing seen");
  for (let i = 0; i < 10; i++) cost.observe(8, 50);
  assertEquals(cost.burstRows(1000), Infinity, "steps all of 8 rows say nothing of a row's cost");
  cost.observe(1, 30);
  cost.observe(16, 70);
  assertEquals(Number.isFinite(cost.burstRows(1000)), true);
  const fresh = new StepCost();
  fresh.observe(1, 10);
  fresh.observe(9, 20);
  assertEquals(fresh.burstRows(1000), Infinity, `fewer than ${StepCost.MIN_STEPS} steps`);
});

Deno.test("StepCost follows a machine that got slower: recent steps weigh more", () => {
  const cost = new StepCost();
  for (let i = 0; i < 50; i++) cost.observe(1 + (i % 8), 10 + 1 * (1 + (i % 8)));
  for (let i = 0; i < 100; i++) cost.observe(1 + (i % 8), 10 + 4 * (1 + (i % 8)));
  assertAlmostEquals(cost.perRowMs!, 4, 0.05);
});

Deno.test("StepCost ignores observations that cannot be costs", () => {
  const cost = new StepCost();
  for (const [rows, ms] of [[0, 5], [3, -1], [2, NaN], [4, Infinity]]) cost.observe(rows!, ms!);
  for (const rows of [1, 2, 3, 4]) cost.observe(rows, 10 * rows);
  assertAlmostEquals(cost.perRowMs!, 10, 1e-9);
  assertAlmostEquals(cost.fixedMs!, 0, 1e-9);
});
