/**
 * Embeddings against llama.cpp's: llama-embedding's vectors of three prompts on three compat
 * files, with mean and last pooling (tests/fixtures/llama_cpp_embedding/README.md says how they
 * were made), computed here as prefill-only sequences of the serving core, then normalized as
 * llama-server does. Also: the same bits alone and beside other work, on 1 or 2 threads.
 */
import { assert, assertEquals } from "@std/assert";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import type { Engine } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { compatPath } from "./harness/compat.ts";
import {
  coreOf,
  cosineDistance,
  embedAll,
  embedBesideOthers,
  embeddingFixture as fixture,
} from "./_embedding_fixture.ts";

const KV = { numBlocks: 64, blockSize: 16 };

for (const stem of ["qwen2-like", "llama3-like", "qwen3-like"]) {
  Deno.test(`${stem}: our prompt ids are llama-embedding's`, async () => {
    const [model, fx] = await Promise.all([loadModel(compatPath(`${stem}-q4_k_m`)), fixture(stem)]);
    const tok = new Tokenizer(model.tokenizer!);
    assertEquals(fx.prompts.map((p) => tok.encode(p)), fx.tokens);
  });

  for (const pooling of ["mean", "last"] as const) {
    Deno.test(`${stem}, ${pooling} pooling: the cpu engine's embeddings are within 1e-3 cosine distance of llama.cpp's, the reference's too`, async () => {
      const [model, fx] = await Promise.all([
        loadModel(compatPath(`${stem}-q4_k_m`)),
        fixture(stem),
      ]);
      const engines: [string, () => Engine | Promise<Engine>][] = [
        ["cpu", () => WasmEngine.create(model.config, model.weights, KV, { threads: 2 })],
        ["reference", () => new CpuEngine(model.config, model.weights, KV)],
      ];
      for (const [name, make] of engines) {
        const core = coreOf(await make(), model, make);
        try {
          const ours = await embedAll(core, fx.tokens, pooling);
          ours.forEach((v, i) => {
            assertEquals(v.length, fx[pooling][i]!.length);
            const d = cosineDistance(v, fx[pooling][i]!);
            assert(d < 1e-3, `${name}, prompt ${i}: cosine distance ${d} to llama.cpp's`);
          });
        } finally {
          await core.close();
        }
      }
    });
  }
}

Deno.test("qwen2-like on the cpu engine: an embedding has the same bits alone, beside 15 other embeddings and generations, and on 1 or 2 threads", async () => {
  const [model, fx] = await Promise.all([
    loadModel(compatPath("qwen2-like-q4_k_m")),
    fixture("qwen2-like"),
  ]);
  const alone: Float32Array[] = [];
  for (const threads of [1, 2]) {
    const make = () =>
      WasmEngine.create(model.config, model.weights, KV, { threads, maxBatchTokens: 256 });
    const core = coreOf(await make(), model, make);
    try {
      const target = fx.tokens[1]!;
      const solo = await core.embed(target, "mean", "interactive");
      alone.push(solo);
      const together = await embedBesideOthers(core, target, fx.tokens);
      assertEquals([...together], [...solo]);
      assert(core.stats().steps > 0);
    } finally {
      await core.close();
    }
  }
  assertEquals([...alone[0]!], [...alone[1]!]);
});
