import { assertEquals } from "@std/assert";
import { resolveConfig } from "../lib/cli/config.ts";
import { servingSettings } from "../lib/cli/serving_settings.ts";

const noEnv = () => undefined;

Deno.test("servingSettings(): each server setting lands where a serving core reads it", () => {
  const s = servingSettings(resolveConfig({
    backend: "cpu",
    threads: "3",
    kvDtype: "f32",
    kvMemory: "64MiB",
    blockSize: "32",
    maxBatchTokens: "100",
    maxRunning: "5",
    maxWaiting: "7",
    pipelineDepth: "2",
    contextLength: "128",
  }, noEnv));
  assertEquals(s.engineOptions, { kvDtype: "f32", threads: 3 });
  assertEquals(s.kvRequest, {
    blockSize: 32,
    maxRunning: 5,
    kvMemory: 64 * 2 ** 20,
    contextFixed: true,
  });
  assertEquals(s.core, {
    backend: "cpu",
    limits: { maxBatchTokens: 100, maxSeqs: 5 },
    engineOptions: { kvDtype: "f32", threads: 3 },
    maxInFlight: 2,
    scheduler: { maxWaiting: 7 },
  });
});

Deno.test("servingSettings(): unset engine options and an automatic KV cache are left out, not undefined", () => {
  const s = servingSettings(resolveConfig({}, noEnv));
  assertEquals(s.engineOptions, {});
  assertEquals(Object.keys(s.kvRequest).sort(), ["blockSize", "maxRunning"]);
});
