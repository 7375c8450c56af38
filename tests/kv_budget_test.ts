import { assertEquals, assertStringIncludes, assertThrows } from "@std/assert";
import { kvBlockBytes, planKvCache } from "../lib/engine/kv_budget.ts";
import type { ModelConfig } from "../lib/model/model_config.ts";

/** Llama 3.2 1B's shape: 16 layers, 8 KV heads of 64, 128k context: 64 KiB of f32 KV a token. */
const LLAMA32_1B: ModelConfig = {
  architecture: "llama",
  dim: 2048,
  hiddenDim: 8192,
  nLayers: 16,
  nHeads: 32,
  nKvHeads: 8,
  headDim: 64,
  vocabSize: 128256,
  contextLength: 131072,
  ropeTheta: 500000,
  ropeDim: 64,
  rmsEps: 1e-5,
};
const MiB = 2 ** 20;

Deno.test("kvBlockBytes() counts K and V of every layer in f32: 64 KiB a token for Llama 3.2 1B", () => {
  assertEquals(kvBlockBytes(LLAMA32_1B, 1), 2 * 16 * 8 * 64 * 4);
});

Deno.test("planKvCache() without --kv-memory gives each running sequence a full context plus the scheduler's watermark, when it fits", () => {
  const small = { ...LLAMA32_1B, contextLength: 4096 };
  const p = planKvCache(small, { blockSize: 16, maxRunning: 4, availableMemory: 64 * 2 ** 30 });
  // 4 x 256 blocks, and ceil(1% of 1024) = 11 spare.
  assertEquals([p.numBlocks, p.contextLength], [1024 + 11, 4096]);
  assertEquals(p.bytes, p.numBlocks * 16 * 64 * 1024);
  assertStringIncludes(p.why, "a full context for each of 4 sequences");
});

Deno.test("planKvCache() caps an automatic cache by the device's binding limit per layer pool and shortens the context to fit", () => {
  // A 128 MiB binding (llvmpipe's) holds 128 MiB / (16 tokens x 8 x 64 x 4 B) = 4096 blocks per pool.
  const p = planKvCache(LLAMA32_1B, {
    blockSize: 16,
    maxRunning: 64,
    maxPoolBytes: 128 * MiB,
    availableMemory: 1024 * 2 ** 30,
  });
  assertEquals(p.numBlocks, 4096);
  // 41 blocks stay free as the watermark: 4055 x 16 tokens for one sequence.
  assertEquals(p.contextLength, (4096 - 41) * 16);
  assertStringIncludes(p.why, "binding limit of 128.0 MiB");
  assertStringIncludes(p.why, `context shortened from 131072 to ${(4096 - 41) * 16} tokens`);
});

Deno.test("planKvCache() takes at most a quarter of the free memory for an automatic cache", () => {
  const p = planKvCache(LLAMA32_1B, { blockSize: 16, maxRunning: 64, availableMemory: 4096 * MiB });
  assertEquals(p.bytes <= 1024 * MiB, true);
  assertEquals(p.numBlocks, Math.floor((1024 * MiB) / kvBlockBytes(LLAMA32_1B, 16)));
  assertStringIncludes(p.why, "a quarter of the 4.0 GiB of free memory");
});

Deno.test("planKvCache() with --kv-memory uses that budget, and refuses one that holds no full context or exceeds the binding limit", () => {
  const small = { ...LLAMA32_1B, contextLength: 2048 };
  const p = planKvCache(small, { blockSize: 16, maxRunning: 64, kvMemory: 256 * MiB });
  assertEquals([p.numBlocks, p.why], [256, "--kv-memory"]);
  // A context of the file's that the cache cannot hold is shortened to what it holds...
  const shortened = planKvCache(small, { blockSize: 16, maxRunning: 1, kvMemory: 64 * MiB });
  assertEquals([shortened.numBlocks, shortened.contextLength], [64, 64 * 16]);
  assertStringIncludes(shortened.why, "context shortened from 2048 to 1024 tokens");
  // ...but one asked for (--context-length) is the user's: the cache that cannot hold it is an error.
  const tooSmall = assertThrows(
    () =>
      planKvCache(small, { blockSize: 16, maxRunning: 1, kvMemory: 64 * MiB, contextFixed: true }),
    Error,
  );
  assertStringIncludes(
    tooSmall.message,
    "holds 64 KV blocks; one full-context sequence (2048 tokens) needs 128",
  );
  const tooBig = assertThrows(
    () =>
      planKvCache(small, {
        blockSize: 16,
        maxRunning: 1,
        kvMemory: 8192 * MiB,
        maxPoolBytes: 128 * MiB,
      }),
    Error,
  );
  assertStringIncludes(tooBig.message, "above the device's binding limit of 128.0 MiB");
});

Deno.test("planKvCache() keeps an automatic cache to 1 GiB when the free memory is unknown (no --allow-sys)", () => {
  const p = planKvCache(LLAMA32_1B, { blockSize: 16, maxRunning: 64 });
  assertEquals(p.numBlocks, Math.floor((1024 * MiB) / kvBlockBytes(LLAMA32_1B, 16)));
  assertStringIncludes(p.why, "free memory unknown");
});

Deno.test("planKvCache() for a model split over two CPU engine memories: capped by their room (and says so) or by a quarter of the free memory, whichever is less", () => {
  // Llama-3.1-8B's shape: 32 layers, 8 KV heads of 128; an f16 block of 16 tokens is 2 MiB.
  const llama8b = { ...LLAMA32_1B, dim: 4096, hiddenDim: 14336, nLayers: 32, headDim: 128 };
  const blockBytes = kvBlockBytes(llama8b, 16, 2);
  assertEquals(blockBytes, 2 * MiB);
  const req = {
    blockSize: 16,
    maxRunning: 4,
    bytesPerElement: 2,
    maxBytes: 1024 * blockBytes,
    memories: 2,
  };
  const roomy = planKvCache(llama8b, { ...req, availableMemory: 20 * 2 ** 30 });
  assertEquals(roomy.numBlocks, 1024);
  assertStringIncludes(
    roomy.why,
    "the room beside the weights in the CPU engine's 2 WebAssembly memories",
  );
  const tight = planKvCache(llama8b, { ...req, availableMemory: 2 * 2 ** 30 });
  assertEquals(tight.numBlocks, 256); // a quarter of 2 GiB, 2 MiB a block
  assertStringIncludes(tight.why, "a quarter of the 2.0 GiB of free memory");
  assertThrows(
    () => planKvCache({ ...llama8b, contextLength: 8192 }, { ...req, kvMemory: 4096 * MiB }),
    Error,
    "--kv-memory 4.0 GiB does not fit in the CPU engine's 2 memories beside the model: use at most 2.0 GiB",
  );
});
