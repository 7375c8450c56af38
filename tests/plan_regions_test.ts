import { assertEquals } from "@std/assert";
import { planRegions } from "../kernels/webgpu/plan_regions.ts";

Deno.test("planRegions() gives each plan with entries a count header and its entries, 256-byte aligned, and none to a plan without", () => {
  // 20-byte entries: 2 take 4 + 40 bytes; 70 take 4 + 1400, starting at the next 256 bytes and
  // rounded up to 6 x 256.
  assertEquals(planRegions([2, 0, 70], 20), {
    regions: [
      { offset: 0, bytes: 44, count: 2 },
      undefined,
      { offset: 256, bytes: 1404, count: 70 },
    ],
    total: 256 + 1536,
  });
  assertEquals(planRegions([0, 0], 8), { regions: [undefined, undefined], total: 0 });
});
