import { assertEquals, assertThrows } from "@std/assert";
import { resolveConfig } from "../lib/cli/config.ts";
import { servedBackend, servingSettings } from "../lib/cli/serving_settings.ts";
import { ServingCore } from "../actors/core.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import type { CachedBackend } from "../lib/backend/cached_backend.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { modelFile } from "./harness/model_files.ts";

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
    grammarCompileTimeout: "1m30s",
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
    grammarCompileMs: 90_000,
  });
});

Deno.test("servingSettings(): unset engine options and an automatic KV cache are left out, not undefined", () => {
  const s = servingSettings(resolveConfig({}, noEnv));
  assertEquals(s.engineOptions, {});
  assertEquals(Object.keys(s.kvRequest).sort(), ["blockSize", "maxRunning"]);
});

Deno.test("servedBackend(): --pooling, --embd-normalize and --similar-cache reach the backend; --similar-cache without --result-cache is refused naming both", async () => {
  const model = await loadModel(modelFile("stories260K.bin"), {
    tokenizerPath: modelFile("tok512.bin"),
  });
  const tokenizer = new Tokenizer(model.tokenizer!);
  const make = () => new CpuEngine(model.config, model.weights, { numBlocks: 16, blockSize: 16 });
  const core = new ServingCore({ engine: make(), engineFactory: make, codec: tokenizer });
  const parts = { name: "m", core, tokenizer, model };
  try {
    const on = servedBackend(
      resolveConfig({
        pooling: "last",
        embdNormalize: "-1",
        resultCache: "1MiB",
        similarCache: "0.9",
        similarCacheMemory: "2MiB",
      }, noEnv),
      parts,
    );
    assertEquals([on.coreBackend.embedder!.pooling, on.coreBackend.embedder!.normalize], [
      "last",
      -1,
    ]);
    const similar = (on.backend as CachedBackend).similar!.stats();
    assertEquals(similar.threshold, 0.9);
    const plain = servedBackend(resolveConfig({}, noEnv), parts);
    assertEquals(plain.backend, plain.coreBackend);
    assertEquals([plain.coreBackend.embedder!.pooling, plain.coreBackend.embedder!.normalize], [
      "mean",
      2,
    ]);
    assertThrows(
      () => servedBackend(resolveConfig({ similarCache: "0.9" }, noEnv), parts),
      Error,
      "--similar-cache needs --result-cache",
    );
    assertThrows(() => resolveConfig({ similarCache: "1.5" }, noEnv), Error, "--similar-cache");
    assertThrows(() => resolveConfig({ pooling: "max" }, noEnv), Error, "--pooling");
  } finally {
    await core.close();
  }
});
