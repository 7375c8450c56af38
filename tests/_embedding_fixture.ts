/**
 * Test helpers for embeddings: llama-embedding's vectors of the compat files
 * (tests/fixtures/llama_cpp_embedding/README.md says how they were made), and the distance the
 * tests bound; serving cores that embed them.
 */
import { ServingCore } from "../actors/core.ts";
import { type Engine, GREEDY } from "../lib/engine/engine.ts";
import { normalizeEmbedding } from "../lib/engine/embedding_norm.ts";
import type { Pooling } from "../lib/engine/pooling.ts";
import type { Model } from "../lib/model/weights.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";

/** Three prompts, their ids as llama.cpp read them, and its mean- and last-pooled vectors. */
export interface EmbeddingFixture {
  readonly prompts: readonly string[];
  readonly tokens: readonly (readonly number[])[];
  readonly mean: readonly (readonly number[])[];
  readonly last: readonly (readonly number[])[];
}

/** The fixture of a compat file's stem ("qwen2-like", ...). */
export async function embeddingFixture(stem: string): Promise<EmbeddingFixture> {
  const url = new URL(`./fixtures/llama_cpp_embedding/${stem}.json`, import.meta.url);
  return JSON.parse(await Deno.readTextFile(url));
}

/** 1 - cosine similarity, in float64. */
export function cosineDistance(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let ab = 0, aa = 0, bb = 0;
  for (let i = 0; i < a.length; i++) (ab += a[i]! * b[i]!, aa += a[i]! ** 2, bb += b[i]! ** 2);
  return 1 - ab / Math.sqrt(aa * bb);
}

/** A serving core over `engine` (restarted with `make`), with the model's tokenizer. */
export function coreOf(
  engine: Engine,
  model: Model,
  make: () => Engine | Promise<Engine>,
): ServingCore {
  return new ServingCore({ engine, engineFactory: make, codec: new Tokenizer(model.tokenizer!) });
}

/** Each prompt's embedding, pooled as asked and L2-normalized as llama-server does. */
export async function embedAll(
  core: ServingCore,
  prompts: readonly (readonly number[])[],
  pooling: Pooling,
): Promise<Float32Array[]> {
  const vs = await Promise.all(prompts.map((p) => core.embed(p, pooling, "interactive")));
  return vs.map((v) => normalizeEmbedding(v, 2));
}

/**
 * `target`'s mean-pooled embedding computed beside 15 others submitted with it: embeddings of
 * prefixes of `prompts` and greedy generations of `maxTokens` from them.
 */
export async function embedBesideOthers(
  core: ServingCore,
  target: readonly number[],
  prompts: readonly (readonly number[])[],
  maxTokens = 6,
): Promise<Float32Array> {
  const others: Promise<unknown>[] = [];
  for (let i = 0; i < 15; i++) {
    const prompt = prompts[i % prompts.length]!;
    if (i % 3 === 2) {
      others.push((async () => {
        const events = core.generate({
          prompt,
          maxTokens,
          sampling: GREEDY,
          stop: [],
          priority: "interactive",
          requestId: `g${i}`,
        });
        for await (const _ of events) { /* drained */ }
      })());
    } else others.push(core.embed(prompt.slice(0, 3 + (i % 5)), "mean", "interactive"));
  }
  const [together] = await Promise.all([core.embed(target, "mean", "interactive"), ...others]);
  return together;
}
