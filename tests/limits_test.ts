import { assertEquals, assertStringIncludes } from "@std/assert";
import { DEFAULT_LIMITS, defaultPipelineDepth } from "../lib/engine/limits.ts";
import { ServingCore } from "../actors/core.ts";
import { FakeEngine, type FakeEngineOptions } from "./harness/fake_engine.ts";
import { TOKENIZER } from "./_fake_core.ts";
import { resolveConfig } from "../lib/cli/config.ts";
import { serveInfo } from "../lib/cli/serve_args.ts";
import { schedulerConfig } from "../lib/core/scheduler.ts";
import { SCHEDULER_DEFAULTS } from "../lib/core/scheduler_config.ts";
import { createExecutorMailbox, SchedulerActor } from "../actors/scheduler.ts";
import { HTTP_DEFAULTS } from "../lib/http/defaults.ts";
import { DEFAULT_MODEL } from "../lib/source/model_source.ts";
import { startService } from "./_http_harness.ts";

const noEnv = () => undefined;

Deno.test("the server's configuration and a bare scheduler default to the same limits", () => {
  const config = resolveConfig({}, noEnv);
  const sched = schedulerConfig({ numBlocks: 1000, blockSize: 16, contextLength: 512 });
  for (const key of ["maxBatchTokens", "maxRunning", "maxWaiting"] as const) {
    assertEquals(config[key], SCHEDULER_DEFAULTS[key], `config ${key}`);
    assertEquals(sched[key], SCHEDULER_DEFAULTS[key], `scheduler ${key}`);
  }
  assertEquals(config.blockSize, DEFAULT_LIMITS.blockSize);
  // "auto": serve sizes the cache from the model and the device (planKvCache).
  assertEquals(DEFAULT_LIMITS.kvMemory, "auto");
  assertEquals(config.kvMemory, undefined);
  // Unset: the serving core picks it from the engine (defaultPipelineDepth).
  assertEquals(config.pipelineDepth, undefined);
  assertEquals(sched.watermarkBlocks, Math.ceil(1000 * DEFAULT_LIMITS.watermarkFraction));
});

Deno.test("the scheduler actor's default pipeline depth is the server's", () => {
  const mailbox = createExecutorMailbox();
  assertEquals(mailbox.capacity, 2 * DEFAULT_LIMITS.pipelineDepth);
  const config = schedulerConfig({ numBlocks: 8, blockSize: 16, contextLength: 64 });
  assertEquals(new SchedulerActor(config, mailbox).maxInFlight, DEFAULT_LIMITS.pipelineDepth);
});

Deno.test("serve's usage shows every limit with its default", () => {
  // What --help prints.
  const err = { message: serveInfo(["--help"]) ?? "(no --help text)" };
  const shown: Record<string, string | number> = {
    "--block-size": DEFAULT_LIMITS.blockSize,
    "--kv-memory": DEFAULT_LIMITS.kvMemory,
    "--max-batch-tokens": DEFAULT_LIMITS.maxBatchTokens,
    "--max-running": DEFAULT_LIMITS.maxRunning,
    "--max-waiting": SCHEDULER_DEFAULTS.maxWaiting,
  };
  for (const [flag, value] of Object.entries(shown)) {
    const line = err.message.split("\n").find((l) => l.trimStart().startsWith(flag + " "));
    assertStringIncludes(line ?? `(no line for ${flag})`, `default ${value}]`);
  }
  const depth = err.message.split("\n").find((l) => l.trimStart().startsWith("--pipeline-depth "));
  assertStringIncludes(
    depth ?? "(no line for --pipeline-depth)",
    `default ${DEFAULT_LIMITS.pipelineDepth}; on webgpu ${DEFAULT_LIMITS.pipelineDepth}-${DEFAULT_LIMITS.readbackPipelineDepth}, adapted to the step's cost`,
  );
});

Deno.test("the HTTP defaults: the configuration, --help and the app read the one table", async () => {
  const config = resolveConfig({}, noEnv);
  // The numbers themselves, written out: a change to the table is a change to this test.
  assertEquals(HTTP_DEFAULTS.maxBodyBytes, 1_048_576);
  assertEquals(
    [config.headerTimeout, config.bodyTimeout, config.keepAliveTimeout, config.drainTimeout],
    [60, 60, 5, 30],
  );
  assertEquals(config.headerTimeout, HTTP_DEFAULTS.headerTimeoutSeconds);
  assertEquals(config.bodyTimeout, HTTP_DEFAULTS.bodyTimeoutSeconds);
  assertEquals(config.keepAliveTimeout, HTTP_DEFAULTS.keepAliveTimeoutSeconds);
  assertEquals(config.drainTimeout, HTTP_DEFAULTS.drainTimeoutSeconds);
  assertEquals(config.model, "stories260K");
  assertEquals(config.model, DEFAULT_MODEL);
  const help = serveInfo(["--help"]) ?? "(no --help text)";
  const line = help.split("\n").find((l) => l.trimStart().startsWith("--header-timeout "));
  assertStringIncludes(line ?? "(no --header-timeout line)", `default 60]`);
  // An app given no body limit reports the table's, and refuses a body one byte over it.
  await using svc = await startService();
  const props = await (await fetch(`${svc.base}/props`)).json();
  assertEquals(props.limits.max_body_bytes, 1_048_576);
  const res = await fetch(`${svc.base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: "x".repeat(1_048_576) }),
  });
  assertEquals(res.status, 413, await res.text());
});

/** A serving core over engines from `make`, with the depth configured or left to the engine. */
function coreOver(make: () => FakeEngine, maxInFlight: number | undefined): ServingCore {
  return new ServingCore({
    engine: make(),
    engineFactory: make,
    codec: TOKENIZER,
    ...(maxInFlight === undefined ? {} : { maxInFlight }),
  });
}

Deno.test("a serving core pipelines 16 steps for an engine whose results come back through a readback, 3 for one with them on the host, and a configured depth wins", async () => {
  const cases: [FakeEngineOptions, number | undefined, number][] = [
    [{ resultsOnHost: false }, undefined, 16],
    [{ resultsOnHost: true }, undefined, 3],
    [{}, undefined, 3],
    [{ resultsOnHost: false }, 2, 2],
  ];
  for (const [opts, maxInFlight, want] of cases) {
    const core = coreOver(() => new FakeEngine(opts), maxInFlight);
    try {
      assertEquals(core.scheduler.maxInFlight, want, JSON.stringify({ opts, maxInFlight }));
    } finally {
      await core.close();
    }
  }
  assertEquals(DEFAULT_LIMITS.readbackPipelineDepth, 16);
  assertEquals(defaultPipelineDepth(false), DEFAULT_LIMITS.readbackPipelineDepth);
});

Deno.test("a serving core adapts the depth between 3 and 16 for an engine that gives its readback latency, unless a depth is configured", async () => {
  const make = () =>
    Object.assign(new FakeEngine({ resultsOnHost: false }), { readbackLatencyMs: 10 });
  for (const [maxInFlight, want] of [[undefined, [3, 16]], [5, [5, 5]]] as const) {
    const core = coreOver(make, maxInFlight);
    try {
      const s = core.scheduler;
      assertEquals([s.minPipelineDepth, s.maxInFlight], [...want], `configured ${maxInFlight}`);
      assertEquals(s.pipelineDepth, want[1], "the deepest before any result");
      assertEquals(core.stats().pipelineDepth, want[1], "what /metrics reports");
    } finally {
      await core.close();
    }
  }
});
