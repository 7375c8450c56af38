import { assertEquals, assertStringIncludes, assertThrows } from "@std/assert";
import { DEFAULT_LIMITS } from "../lib/engine/limits.ts";
import { resolveConfig } from "../lib/cli/config.ts";
import { parseServeArgs } from "../lib/cli/serve.ts";
import { schedulerConfig } from "../lib/core/scheduler.ts";
import { createExecutorMailbox, SchedulerActor } from "../actors/scheduler.ts";

const noEnv = () => undefined;

Deno.test("the server's configuration and a bare scheduler default to the same limits", () => {
  const config = resolveConfig({}, noEnv);
  const sched = schedulerConfig({ numBlocks: 1000, blockSize: 16, contextLength: 512 });
  for (const key of ["maxBatchTokens", "maxRunning", "maxWaiting"] as const) {
    assertEquals(config[key], DEFAULT_LIMITS[key], `config ${key}`);
    assertEquals(sched[key], DEFAULT_LIMITS[key], `scheduler ${key}`);
  }
  assertEquals(config.blockSize, DEFAULT_LIMITS.blockSize);
  // "auto": serve sizes the cache from the model and the device (planKvCache).
  assertEquals(DEFAULT_LIMITS.kvMemory, "auto");
  assertEquals(config.kvMemory, undefined);
  assertEquals(config.pipelineDepth, DEFAULT_LIMITS.pipelineDepth);
  assertEquals(sched.watermarkBlocks, Math.ceil(1000 * DEFAULT_LIMITS.watermarkFraction));
});

Deno.test("the scheduler actor's default pipeline depth is the server's", () => {
  const mailbox = createExecutorMailbox();
  assertEquals(mailbox.capacity, 2 * DEFAULT_LIMITS.pipelineDepth);
  const config = schedulerConfig({ numBlocks: 8, blockSize: 16, contextLength: 64 });
  assertEquals(new SchedulerActor(config, mailbox).maxInFlight, DEFAULT_LIMITS.pipelineDepth);
});

Deno.test("serve's usage shows every limit with its default", () => {
  // The usage text comes with the refusal of an unknown flag (and is what --help prints).
  const err = assertThrows(() => parseServeArgs(["--no-such-flag"], noEnv), Error) as Error;
  const shown: Record<string, string | number> = {
    "--block-size": DEFAULT_LIMITS.blockSize,
    "--kv-memory": DEFAULT_LIMITS.kvMemory,
    "--max-batch-tokens": DEFAULT_LIMITS.maxBatchTokens,
    "--max-running": DEFAULT_LIMITS.maxRunning,
    "--max-waiting": DEFAULT_LIMITS.maxWaiting,
    "--pipeline-depth": DEFAULT_LIMITS.pipelineDepth,
  };
  for (const [flag, value] of Object.entries(shown)) {
    const line = err.message.split("\n").find((l) => l.trimStart().startsWith(flag + " "));
    assertStringIncludes(line ?? `(no line for ${flag})`, `default ${value}]`);
  }
});
