/**
 * The result cache on the real model (stories260K, CPU reference engine) behind the real HTTP
 * app: a repeated deterministic request is answered from the cache with exactly the tokens a
 * server without a cache generates for it; an unseeded sampled one is always generated.
 */
import { assert, assertEquals, assertGreater } from "@std/assert";
import type { GenerationEvent } from "../lib/core/generation.ts";
import { ServingCore } from "../actors/core.ts";
import { createApp } from "../lib/http/app.ts";
import { RequestLog } from "../lib/http/request_log.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { CachedBackend } from "../lib/backend/cached_backend.ts";
import { CoreBackend } from "../lib/backend/core_backend.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { serveService } from "../lib/http/serve.ts";
import { metricValue, parseSse, postJson, scrape, TestSocket } from "./_http_harness.ts";
import { modelFile } from "./harness/model_files.ts";

const model = await loadModel(modelFile("stories260K.bin"), {
  tokenizerPath: modelFile("tok512.bin"),
});
const tokenizer = new Tokenizer(model.tokenizer!);

/** The real server stack on a free port: core, CoreBackend, optional cache, app. */
async function serveModel(cacheBytes: number) {
  const make = () => new CpuEngine(model.config, model.weights, { numBlocks: 128, blockSize: 16 });
  const core = new ServingCore({ engine: make(), engineFactory: make, codec: tokenizer });
  const inner = new CoreBackend("stories260K", core, tokenizer);
  const backend = cacheBytes > 0 ? new CachedBackend(inner, cacheBytes) : inner;
  const service = createApp({ backend, requestLog: new RequestLog("text", () => {}) });
  const server = await serveService(service, {
    hostname: "127.0.0.1",
    port: 0,
    drainTimeoutMs: 1000,
    signals: [],
  });
  const { port } = server.addr;
  return {
    base: `http://127.0.0.1:${port}`,
    ws: `ws://127.0.0.1:${port}/v1/stream`,
    async [Symbol.asyncDispose]() {
      service.close();
      await server.stop();
      await core.close();
    },
  };
}

/** One generation over the WebSocket: its token ids, text and done frame. */
async function generate(url: string, frame: Record<string, unknown>) {
  const ws = await TestSocket.open(url);
  try {
    ws.send({ type: "generate", id: "g", ...frame });
    const frames = await ws.collect("g", 20_000);
    const done = frames.at(-1)!;
    assertEquals(done.type, "done", JSON.stringify(done));
    const tokens = frames.filter((f) => f.type === "token");
    return {
      ids: tokens.flatMap((f) => f.token_ids as number[]),
      text: tokens.map((f) => f.text).join(""),
      logprobs: tokens.map((f) => f.logprob),
      done,
    };
  } finally {
    await ws.close();
  }
}

const greedy = { prompt: "Once upon a time", max_tokens: 48, temperature: 0 };
const seeded = {
  prompt: "The little dog",
  max_tokens: 48,
  temperature: 0.9,
  top_p: 0.95,
  seed: 1234,
};

for (const [what, frame] of [["greedy", greedy], ["seeded", seeded]] as const) {
  Deno.test(`a repeated ${what} request is answered from the cache with the tokens a server without a cache generates`, async () => {
    let reference;
    {
      await using plain = await serveModel(0);
      reference = await generate(plain.ws, frame);
      assertEquals(reference.done.cached, false);
    }
    await using svc = await serveModel(1 << 20);
    const first = await generate(svc.ws, frame);
    const second = await generate(svc.ws, frame);
    assertEquals(first.done.cached, false);
    assertEquals(second.done.cached, true);
    assertGreater(second.done.saved_ms as number, 0);
    assertEquals(first.ids, reference.ids);
    assertEquals(second.ids, reference.ids);
    assertEquals(second.text, reference.text);
    assertEquals(second.done.finish_reason, reference.done.finish_reason);
    assertEquals(second.done.usage, {
      ...(reference.done.usage as Record<string, number>),
      // A replay computed no prompt token.
      cached_tokens: (reference.done.usage as Record<string, number>).prompt_tokens,
    });
    assertGreater(reference.ids.length, 10);
    const metrics = await scrape(svc.base);
    assertEquals(metricValue(metrics, "llm_result_cache_hits_total"), 1);
    assertEquals(metricValue(metrics, "llm_result_cache_misses_total"), 1);
    assertEquals(metricValue(metrics, "llm_result_cache_entries"), 1);
    assertGreater(metricValue(metrics, "llm_result_cache_bytes")!, 0);
    assertGreater(metricValue(metrics, "llm_result_cache_saved_seconds_total")!, 0);
    // The WebSocket stats feed (the playground's panel) carries the same counts.
    const ws = await TestSocket.open(svc.ws);
    try {
      ws.send({ type: "subscribe_stats" });
      const stats = await ws.take((f) => f.type === "stats");
      assertEquals(stats.result_cache, {
        hits: 1,
        misses: 1,
        entries: 1,
        bytes: metricValue(metrics, "llm_result_cache_bytes"),
      });
    } finally {
      await ws.close();
    }
  });
}

Deno.test("an unseeded sampled request is never answered from the cache", async () => {
  await using svc = await serveModel(1 << 20);
  const frame = { prompt: "Once upon a time", max_tokens: 32, temperature: 1 };
  const runs = [await generate(svc.ws, frame), await generate(svc.ws, frame)];
  for (const r of runs) assertEquals(r.done.cached, false);
  const metrics = await scrape(svc.base);
  assertEquals(metricValue(metrics, "llm_result_cache_hits_total"), 0);
  assertEquals(metricValue(metrics, "llm_result_cache_misses_total"), 0);
  assertEquals(metricValue(metrics, "llm_result_cache_entries"), 0);
});

Deno.test("a changed parameter misses the cache; the same request over HTTP, streamed, replays the stored answer as a stream", async () => {
  await using svc = await serveModel(1 << 20);
  const body = { prompt: "Once upon a time", max_tokens: 24, temperature: 0 };
  const first = await (await postJson(`${svc.base}/v1/completions`, body)).json();
  assertEquals(first.cached, false);
  const longer = await (await postJson(`${svc.base}/v1/completions`, { ...body, max_tokens: 25 }))
    .json();
  assertEquals(longer.cached, false);
  const res = await postJson(`${svc.base}/v1/completions`, { ...body, stream: true });
  const chunks = parseSse(await res.text()) as Array<Record<string, any>>;
  assertEquals(chunks.at(-1), "[DONE]");
  const data = chunks.slice(0, -1);
  // One chunk per stored token event, then the finish chunk.
  assertGreater(data.length, 3);
  assertEquals(data.map((c) => c.choices[0].text).join(""), first.choices[0].text);
  const last = data.at(-1)!;
  assertEquals(last.choices[0].finish_reason, first.choices[0].finish_reason);
  assertEquals(last.cached, true);
  assert(typeof last.saved_ms === "number");
  const metrics = await scrape(svc.base);
  assertEquals(metricValue(metrics, "llm_result_cache_hits_total"), 1);
  assertEquals(metricValue(metrics, "llm_result_cache_misses_total"), 2);
});

Deno.test("an identical request arriving while the first generates follows it instead of generating again", async () => {
  let reference;
  {
    await using plain = await serveModel(0);
    reference = await generate(plain.ws, { ...greedy, max_tokens: 200 });
  }
  await using svc = await serveModel(1 << 20);
  const ws = await TestSocket.open(svc.ws);
  try {
    ws.send({ type: "generate", id: "a", ...greedy, max_tokens: 200 });
    await ws.take((f) => f.id === "a" && f.type === "token", 20_000);
    ws.send({ type: "generate", id: "b", ...greedy, max_tokens: 200 });
    const [a, b] = [await ws.collect("a", 20_000), await ws.collect("b", 20_000)];
    const ids = (frames: Array<Record<string, unknown>>) =>
      frames.filter((f) => f.type === "token").flatMap((f) => f.token_ids as number[]);
    // "a" lost its first token frame to take() above.
    assertEquals(ids(b), reference.ids);
    assertEquals(reference.ids.slice(-ids(a).length), ids(a));
    assertEquals([a.at(-1)!.cached, b.at(-1)!.cached], [false, true]);
    assertEquals(b.at(-1)!.usage, {
      ...(reference.done.usage as Record<string, number>),
      cached_tokens: (reference.done.usage as Record<string, number>).prompt_tokens,
    });
  } finally {
    await ws.close();
  }
  const metrics = await scrape(svc.base);
  assertEquals(metricValue(metrics, "llm_result_cache_misses_total"), 1);
  assertEquals(metricValue(metrics, "llm_result_cache_hits_total"), 1);
});

Deno.test("a follower whose first request is cancelled still gets the whole answer from the one generation", async () => {
  let reference;
  {
    await using plain = await serveModel(0);
    reference = await generate(plain.ws, { ...greedy, max_tokens: 200 });
  }
  await using svc = await serveModel(1 << 20);
  const ws = await TestSocket.open(svc.ws);
  try {
    ws.send({ type: "generate", id: "a", ...greedy, max_tokens: 200 });
    await ws.take((f) => f.id === "a" && f.type === "token", 20_000);
    // Frames on one socket are handled in order: "b" follows "a" before "a" is cancelled.
    ws.send({ type: "generate", id: "b", ...greedy, max_tokens: 200 });
    ws.send({ type: "cancel", id: "a" });
    const a = await ws.collect("a", 20_000);
    const b = await ws.collect("b", 20_000);
    assertEquals(a.at(-1)!.finish_reason, "cancelled");
    const bIds = b.filter((f) => f.type === "token").flatMap((f) => f.token_ids as number[]);
    assertEquals(bIds, reference.ids);
    assertEquals(b.at(-1)!.finish_reason, reference.done.finish_reason);
    // The generation went on for "b" when "a" left: one generation, "b" an answer it shared.
    assertEquals(b.at(-1)!.cached, true);
  } finally {
    await ws.close();
  }
  const metrics = await scrape(svc.base);
  assertEquals(metricValue(metrics, "llm_result_cache_misses_total"), 1);
  assertEquals(metricValue(metrics, "llm_result_cache_hits_total"), 1);
  assertEquals(metricValue(metrics, "llm_result_cache_entries"), 1);
});

Deno.test("a follower never waits on the leader's client: a leader that stops reading does not hold it", async () => {
  const { FakeCore } = await import("./_fake_core.ts");
  await using inner = new FakeCore({ contextLength: 1024 });
  const cached = new CachedBackend(inner, 1 << 20);
  const req = {
    prompt: inner.tokenize("Once upon a time", { bos: true, special: false }),
    maxTokens: 60,
    sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 },
    stop: [],
    priority: "interactive" as const,
    requestId: "r",
    deterministic: true,
  };
  const want = inner.continuation(req.prompt, req.maxTokens);
  const text = (events: GenerationEvent[]) =>
    events.map((e) => (e.type === "token" ? e.text : "")).join("");
  // The leader takes "started" and one token, then stops reading (its socket is full).
  const leader = cached.generate(req, new AbortController().signal)[Symbol.asyncIterator]();
  const taken = [(await leader.next()).value, (await leader.next()).value] as GenerationEvent[];
  assertEquals(taken.map((e) => e.type), ["started", "token"]);
  const follower: GenerationEvent[] = [];
  const followed = (async () => {
    for await (const e of cached.generate(req, new AbortController().signal)) follower.push(e);
  })();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const deadline = new Promise<"stuck">((r) => timer = setTimeout(() => r("stuck"), 10_000));
  const outcome = await Promise.race([followed.then(() => "done" as const), deadline]);
  clearTimeout(timer);
  assertEquals(outcome, "done", `the follower got ${follower.length} events and waited`);
  assertEquals(text(follower), want.text);
  const last = follower.at(-1);
  assertEquals(last?.type === "done" ? last.finishReason : last, "length");
  // The leader, reading again, gets the same answer.
  for (let n = await leader.next(); !n.done; n = await leader.next()) taken.push(n.value);
  assertEquals(text(taken), want.text);
  assertEquals(inner.requests.length, 1, "one generation for both");
});
