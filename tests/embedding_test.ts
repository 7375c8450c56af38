/**
 * Embeddings against llama.cpp's: llama-embedding's vectors of three prompts on three compat
 * files, with mean and last pooling (tests/fixtures/llama_cpp_embedding/README.md says how they
 * were made), computed here as prefill-only sequences of the serving core, then normalized as
 * llama-server does. Also: the same bits alone and beside other work, on 1 or 2 threads.
 */
import { assert, assertEquals } from "@std/assert";
import { ServingCore } from "../actors/core.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { type Engine, GREEDY } from "../lib/engine/engine.ts";
import { normalizeEmbedding } from "../lib/engine/embedding_norm.ts";
import type { Pooling } from "../lib/engine/pooling.ts";
import { loadModel } from "../lib/model/load_model.ts";
import type { Model } from "../lib/model/weights.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { compatPath } from "./harness/compat.ts";

interface Fixture {
  readonly prompts: readonly string[];
  readonly tokens: readonly (readonly number[])[];
  readonly mean: readonly (readonly number[])[];
  readonly last: readonly (readonly number[])[];
}

async function fixture(stem: string): Promise<Fixture> {
  const url = new URL(`./fixtures/llama_cpp_embedding/${stem}.json`, import.meta.url);
  return JSON.parse(await Deno.readTextFile(url));
}

/** 1 - cosine similarity, in float64. */
function cosineDistance(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let ab = 0, aa = 0, bb = 0;
  for (let i = 0; i < a.length; i++) (ab += a[i]! * b[i]!, aa += a[i]! ** 2, bb += b[i]! ** 2);
  return 1 - ab / Math.sqrt(aa * bb);
}

const KV = { numBlocks: 64, blockSize: 16 };

function coreOf(engine: Engine, model: Model, make: () => Engine | Promise<Engine>) {
  return new ServingCore({ engine, engineFactory: make, codec: new Tokenizer(model.tokenizer!) });
}

async function embedAll(
  core: ServingCore,
  prompts: readonly (readonly number[])[],
  pooling: Pooling,
): Promise<Float32Array[]> {
  const vs = await Promise.all(prompts.map((p) => core.embed(p, pooling, "interactive")));
  return vs.map((v) => normalizeEmbedding(v, 2));
}

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
      // 15 others: embeddings of the other prompts and of prefixes, and generations, together.
      const others: Promise<unknown>[] = [];
      for (let i = 0; i < 15; i++) {
        if (i % 3 === 2) {
          others.push((async () => {
            for await (
              const _ of core.generate({
                prompt: fx.tokens[i % 3]!,
                maxTokens: 6,
                sampling: GREEDY,
                stop: [],
                priority: "interactive",
                requestId: `g${i}`,
              })
            ) { /* drained */ }
          })());
        } else {others.push(
            core.embed(fx.tokens[i % 3]!.slice(0, 3 + (i % 5)), "mean", "interactive"),
          );}
      }
      const batched = core.embed(target, "mean", "interactive");
      const [together] = await Promise.all([batched, ...others]);
      assertEquals([...(together as Float32Array)], [...solo]);
      assert(core.stats().steps > 0);
    } finally {
      await core.close();
    }
  }
  assertEquals([...alone[0]!], [...alone[1]!]);
});
