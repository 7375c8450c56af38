/**
 * Embeddings on the WebGPU engine, as embedding_test.ts checks them on the CPU engines: the
 * serving core's prefill-only sequences, pooled and normalized, against llama-embedding's
 * vectors (tests/fixtures/llama_cpp_embedding), the cpu engine's and the reference engine's; and
 * the same bits alone and beside other work.
 *
 * The engine runs with the server's KV cache (f16 where the device has shader-f16, as lavapipe
 * does). Its activations are f32, as the reference engine's; the cpu engine quantizes them to 8
 * bits as llama.cpp does. Measured on lavapipe: within 1.8e-4 cosine distance of llama.cpp's
 * and the cpu engine's, 1.6e-8 of the reference's (1.8e-13 with an f32 cache).
 *
 * Cost on llvmpipe (2 cores): embedding steps sample nothing, so the 128k/152k classifiers do
 * not run; an engine is built in 2-4 s after the first (which compiles the pipelines).
 */
import { assert, assertEquals } from "@std/assert";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { WebGpuEngine } from "../kernels/webgpu/webgpu_engine.ts";
import type { Engine } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import type { Model } from "../lib/model/weights.ts";
import { compatPath } from "./harness/compat.ts";
import { testGpu } from "./_gpu.ts";
import {
  coreOf,
  cosineDistance,
  embedAll,
  embedBesideOthers,
  embeddingFixture,
} from "./_embedding_fixture.ts";

const KV = { numBlocks: 64, blockSize: 16 };

function webgpu(model: Model, maxBatchTokens?: number): () => Promise<Engine> {
  return async () =>
    WebGpuEngine.create(model.config, model.weights, KV, {
      gpu: await testGpu(),
      ...(maxBatchTokens ? { maxBatchTokens } : {}),
    });
}

/** Each pooling's normalized vectors of the fixture's prompts on the engine `make` builds. */
async function embedFixture(
  make: () => Engine | Promise<Engine>,
  model: Model,
  tokens: readonly (readonly number[])[],
): Promise<Record<"mean" | "last", Float32Array[]>> {
  const core = coreOf(await make(), model, make);
  try {
    return {
      mean: await embedAll(core, tokens, "mean"),
      last: await embedAll(core, tokens, "last"),
    };
  } finally {
    await core.close();
  }
}

for (const stem of ["qwen2-like", "llama3-like"]) {
  Deno.test(`${stem} on webgpu, mean and last pooling: embeddings within 1e-3 cosine distance of llama.cpp's and the cpu engine's, 1e-6 of the reference engine's`, async () => {
    const [model, fx] = await Promise.all([
      loadModel(compatPath(`${stem}-q4_k_m`)),
      embeddingFixture(stem),
    ]);
    const gpu = await embedFixture(webgpu(model), model, fx.tokens);
    const cpu = await embedFixture(
      () => WasmEngine.create(model.config, model.weights, KV, { threads: 2 }),
      model,
      fx.tokens,
    );
    const reference = await embedFixture(
      () => new CpuEngine(model.config, model.weights, KV),
      model,
      fx.tokens,
    );
    for (const pooling of ["mean", "last"] as const) {
      gpu[pooling].forEach((v, i) => {
        const where = `${stem}, ${pooling} pooling, prompt ${i}`;
        assertEquals(v.length, fx[pooling][i]!.length);
        const bounds: [string, ArrayLike<number>, number][] = [
          ["llama.cpp's", fx[pooling][i]!, 1e-3],
          ["the cpu engine's", cpu[pooling][i]!, 1e-3],
          ["the reference engine's", reference[pooling][i]!, 1e-6],
        ];
        for (const [what, want, bound] of bounds) {
          const d = cosineDistance(v, want);
          assert(d < bound, `${where}: cosine distance ${d} to ${what}`);
        }
      });
    }
  });
}

Deno.test("qwen2-like on webgpu: an embedding has the same bits alone and beside 15 other embeddings and generations", async () => {
  const [model, fx] = await Promise.all([
    loadModel(compatPath("qwen2-like-q4_k_m")),
    embeddingFixture("qwen2-like"),
  ]);
  const make = webgpu(model, 256);
  const core = coreOf(await make(), model, make);
  try {
    const target = fx.tokens[1]!;
    const solo = await core.embed(target, "mean", "interactive");
    // Generations of 2 tokens: each sampled step runs the 152k-row classifier on llvmpipe.
    const together = await embedBesideOthers(core, target, fx.tokens, 2);
    assertEquals([...together], [...solo]);
    assert(core.stats().steps > 2);
  } finally {
    await core.close();
  }
});
