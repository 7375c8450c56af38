import { assertAlmostEquals, assertEquals } from "@std/assert";
import { StepCost } from "../lib/core/step_cost.ts";

Deno.test("StepCost fits a fixed, a per-row and a per-sample cost from the steps it saw", () => {
  const cost = new StepCost();
  for (const [rows, sampled] of [[1, 1], [2, 2], [33, 1], [5, 5], [1, 1], [100, 4]]) {
    cost.observe(rows!, sampled!, 25 + 3 * rows! + 20 * sampled!);
  }
  assertAlmostEquals(cost.fixedMs!, 25, 1e-6);
  assertAlmostEquals(cost.perRowMs!, 3, 1e-6);
  assertAlmostEquals(cost.perSampleMs!, 20, 1e-6);
  // Hand-computed: 10 prompts of 30 rows beside 4 decodes. A step without them costs
  // 25 + (3 + 20) × 4 = 117 ms, a prompt 3 × 30 + 20 = 110: √(10 × 117 / 110) prompts a step.
  assertAlmostEquals(
    cost.burstRows({ rows: 300, prompts: 10 }, 4),
    30 * Math.sqrt(1170 / 110),
    1e-6,
  );
});

Deno.test("StepCost with decodes only fits rows alone", () => {
  const cost = new StepCost();
  for (const n of [1, 2, 3, 4, 8]) cost.observe(n, n, 10 + 5 * n);
  assertAlmostEquals(cost.fixedMs!, 10, 1e-6);
  assertAlmostEquals(cost.perRowMs!, 5, 1e-6);
  assertEquals(cost.perSampleMs, 0);
});

Deno.test("StepCost cuts nothing until it has seen enough steps of different sizes", () => {
  const cost = new StepCost();
  const backlog = { rows: 1000, prompts: 10 };
  assertEquals(cost.burstRows(backlog, 0), Infinity, "nothing seen");
  for (let i = 0; i < 10; i++) cost.observe(8, 1, 50);
  assertEquals(
    cost.burstRows(backlog, 0),
    Infinity,
    "steps all of 8 rows say nothing of a row's cost",
  );
  cost.observe(1, 1, 30);
  cost.observe(16, 1, 70);
  assertEquals(Number.isFinite(cost.burstRows(backlog, 0)), true);
  assertEquals(cost.burstRows({ rows: 0, prompts: 0 }, 3), Infinity, "no prompts, nothing to cut");
  const fresh = new StepCost();
  fresh.observe(1, 1, 10);
  fresh.observe(9, 1, 20);
  assertEquals(fresh.burstRows(backlog, 0), Infinity, `fewer than ${StepCost.MIN_STEPS} steps`);
});

Deno.test("StepCost follows a machine that got slower: recent steps weigh more", () => {
  const cost = new StepCost();
  const rows = (i: number) => 1 + (i % 8);
  for (let i = 0; i < 50; i++) cost.observe(rows(i), 1, 10 + 1 * rows(i));
  for (let i = 0; i < 100; i++) cost.observe(rows(i), 1, 10 + 4 * rows(i));
  assertAlmostEquals(cost.perRowMs!, 4, 0.05);
});

Deno.test("StepCost ignores observations that cannot be costs", () => {
  const cost = new StepCost();
  for (
    const [rows, sampled, ms] of [[0, 0, 5], [3, 1, -1], [2, 1, NaN], [4, 1, Infinity], [2, 3, 9]]
  ) {
    cost.observe(rows!, sampled!, ms!);
  }
  for (const n of [1, 2, 3, 4]) cost.observe(n, 1, 10 * n);
  assertAlmostEquals(cost.perRowMs!, 10, 1e-9);
  assertAlmostEquals(cost.fixedMs!, 0, 1e-9);
});
