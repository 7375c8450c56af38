/**
 * The cache for similar questions on the real model (stories260K, the reference engine, which
 * returns hidden states) behind the real HTTP app. The oracle of "similar" is the model's own
 * embeddings of the two questions, asked directly of /v1/embeddings and compared in float64:
 * a threshold just below their cosine is a hit, just above a miss.
 */
import { assert, assertEquals } from "@std/assert";
import { ServingCore } from "../actors/core.ts";
import { createApp } from "../lib/http/app.ts";
import { RequestLog } from "../lib/http/request_log.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { CachedBackend, type SimilarCacheSettings } from "../lib/backend/cached_backend.ts";
import { CoreBackend, embeddingSettings } from "../lib/backend/core_backend.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { serveService } from "../lib/http/serve.ts";
import { modelFile } from "./harness/model_files.ts";

const model = await loadModel(modelFile("stories260K.bin"), {
  tokenizerPath: modelFile("tok512.bin"),
});
const tokenizer = new Tokenizer(model.tokenizer!);
// stories260K has no chat template: a chat is rendered in the plain format.
const Q1 = "Lily saw a big red ball in the park";
const Q2 = "Lily saw a big red ball in the garden";
const OTHER = "Tom ate soup";

async function serveModel(similar: SimilarCacheSettings) {
  const make = () => new CpuEngine(model.config, model.weights, { numBlocks: 128, blockSize: 16 });
  const core = new ServingCore({ engine: make(), engineFactory: make, codec: tokenizer });
  const inner = new CoreBackend(
    "stories260K",
    core,
    tokenizer,
    undefined,
    undefined,
    embeddingSettings(model),
  );
  const backend = new CachedBackend(inner, 1 << 20, similar);
  const service = createApp({
    backend,
    requestLog: new RequestLog("text", () => {}),
    apiKeys: ["key-a", "key-b"],
  });
  const server = await serveService(service, {
    hostname: "127.0.0.1",
    port: 0,
    drainTimeoutMs: 1000,
    signals: [],
  });
  const base = `http://127.0.0.1:${server.addr.port}`;
  const post = async (path: string, body: unknown, key = "key-a") => {
    const r = await fetch(`${base}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify(body),
    });
    const j = await r.json();
    assertEquals(r.status, 200, JSON.stringify(j));
    return j;
  };
  return {
    backend,
    post,
    metrics: async () =>
      await (await fetch(`${base}/metrics`, { headers: { authorization: "Bearer key-a" } }))
        .text(),
    ask: (question: string, extra: Record<string, unknown> = {}, key = "key-a") =>
      post("/v1/chat/completions", {
        messages: [{ role: "user", content: question }],
        max_tokens: 6,
        temperature: 0,
        ...extra,
      }, key),
    async [Symbol.asyncDispose]() {
      service.close();
      await server.stop();
      await core.close();
    },
  };
}

/** Cosine similarity of the model's own embeddings of two texts, in float64. */
async function similarity(
  post: (path: string, body: unknown) => Promise<{ data: { embedding: number[] }[] }>,
  a: string,
  b: string,
) {
  const { data } = await post("/v1/embeddings", { input: [a, b] });
  const [x, y] = [data[0]!.embedding, data[1]!.embedding];
  let xy = 0, xx = 0, yy = 0;
  for (let i = 0; i < x.length; i++) (xy += x[i]! * y[i]!, xx += x[i]! ** 2, yy += y[i]! ** 2);
  return xy / Math.sqrt(xx * yy);
}

Deno.test("similar cache: a question within the threshold of a cached one gets its answer, marked; just past it, its own", async () => {
  // Measure the two questions' similarity first, with the cache off (threshold above 1).
  let score: number;
  {
    await using s = await serveModel({ threshold: 2, capacityBytes: 1 << 20 });
    score = await similarity(s.post, Q1, Q2);
  }
  assert(score > 0.5 && score < 1, `the questions' similarity is ${score}`);
  {
    await using s = await serveModel({ threshold: score - 1e-4, capacityBytes: 1 << 20 });
    const first = await s.ask(Q1);
    assertEquals(first.cached, false);
    const second = await s.ask(Q2);
    assertEquals(second.cached, true);
    assertEquals(second.choices[0].message.content, first.choices[0].message.content);
    assertEquals(second.llmserve.cache.kind, "similar");
    assert(Math.abs(second.llmserve.cache.score - score) < 1e-3, JSON.stringify(second.llmserve));
    assertEquals(second.llmserve.cache.matched, Q1);
    // Another API key never sees the first key's entries; cache: false skips the cache.
    assertEquals((await s.ask(Q2, {}, "key-b")).cached, false);
    assertEquals((await s.ask(Q2, { cache: false })).cached, false);
    // A sampled request without a seed never hits, even the identical question.
    assertEquals((await s.ask(Q1, { temperature: 0.8 })).cached, false);
    // Another context (a system message before the question) is another entry.
    const withSystem = await s.post("/v1/chat/completions", {
      messages: [{ role: "system", content: "Be brief." }, { role: "user", content: Q2 }],
      max_tokens: 6,
      temperature: 0,
    });
    assertEquals(withSystem.cached, false);
    const stats = s.backend.stats().resultCache!.similar!;
    assertEquals([stats.hits, stats.misses], [1, 3]);
    const metrics = await s.metrics();
    assert(metrics.includes('llm_similar_cache_lookups_total{outcome="hit"} 1\n'), metrics);
    assert(metrics.includes('llm_similar_cache_lookups_total{outcome="miss"} 3\n'), metrics);
  }
  {
    await using s = await serveModel({ threshold: score + 1e-4, capacityBytes: 1 << 20 });
    await s.ask(Q1);
    const second = await s.ask(Q2);
    assertEquals(second.cached, false);
    assertEquals(second.llmserve, undefined);
    // Just below the threshold: counted as a near miss in its 0.05 band.
    const near = s.backend.stats().resultCache!.similar!.nearMisses;
    assertEquals(near, { [(Math.floor(score * 20) / 20).toFixed(2)]: 1 });
  }
});

Deno.test("similar cache: bounded in bytes, the least recently used question is dropped first", async () => {
  // One server measures what an entry costs and how close Q1 and Q2 are.
  let entry: number, score: number;
  {
    await using s = await serveModel({ threshold: 2, capacityBytes: 1 << 20 });
    score = await similarity(s.post, Q1, Q2);
    await s.ask(Q1);
    entry = s.backend.stats().resultCache!.similar!.bytes;
  }
  // Room for one entry, not two: asking OTHER drops Q1, so Q2 finds nothing similar.
  const capacityBytes = Math.floor(1.5 * entry);
  await using s = await serveModel({ threshold: score - 1e-4, capacityBytes });
  const stats = () => s.backend.stats().resultCache!.similar!;
  await s.ask(Q1);
  await s.ask(OTHER);
  assertEquals(stats().entries, 1);
  assert(stats().bytes <= capacityBytes);
  const second = await s.ask(Q2);
  assertEquals([second.cached, second.llmserve], [false, undefined]);
});
