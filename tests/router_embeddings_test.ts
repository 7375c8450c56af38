/**
 * Embeddings and rerank through the routers, over a real nats-server with replicas and routers
 * as child processes. The oracle is a replica's own HTTP API, asked directly: the router's
 * /v1/embeddings, /api/embed and /v1/rerank must give its vectors and scores bit for bit, for a
 * plain router and a router by model, and when the replica computing part of a request dies.
 */
// deno-lint-ignore no-import-prefix -- the official client, pinned as the other tests pin it
import OpenAI, { toFile } from "npm:openai@7.59.0";
import { assert, assertEquals, assertGreater, assertStringIncludes } from "@std/assert";
import { compatPath } from "./harness/compat.ts";
import { metricValue, scrape } from "./_http_harness.ts";
import { Cluster, type Member, until } from "./_cluster.ts";

const QWEN3 = "qwen3-like-q4_k_m";
const QWEN2 = "qwen2-like-q4_k_m";

const replicaArgs = (stem: string, extra: string[] = []) => [
  ...["--model", compatPath(stem), "--backend", "cpu", "--kv-memory", "8MiB"],
  ...["--max-batch-tokens", "128", ...extra],
];
/** A rerank prompt of the replicas' own: a router that asked in another would score otherwise. */
const RERANK_PROMPT = "Question: {query}\nPassage: {document}\nDoes the passage answer it?";

async function post(base: string, path: string, body: unknown) {
  const r = await fetch(`${base}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
}

/** The answer's body, which must be a 200. */
async function ok(base: string, path: string, body: unknown) {
  const r = await post(base, path, body);
  assertEquals(r.status, 200, `${path} on ${base}: ${JSON.stringify(r.body)}`);
  return r.body;
}

const TEXTS = [
  "The quick brown fox jumps over the lazy dog.",
  "Embeddings travel over NATS as little-endian floats.",
  "A",
  "Paris is the capital of France.",
  "Bananas are yellow and grow in bunches.",
  "What is the capital of France?",
];

Deno.test("a plain router's /v1/embeddings, /api/embed, /v1/rerank and embedding batch lines give a replica's own vectors and scores, exactly", async () => {
  await using cluster = await Cluster.start();
  const [a, b] = await Promise.all([
    cluster.replicaServing(replicaArgs(QWEN3, ["--rerank-prompt", RERANK_PROMPT])),
    cluster.replicaServing(replicaArgs(QWEN3, ["--rerank-prompt", RERANK_PROMPT])),
  ]);
  const dataDir = await Deno.makeTempDir({ prefix: "router_embeddings_" });
  const router = await cluster.router(["--data-dir", dataDir]);
  await cluster.routerSees(router, 2, 30_000);

  // Six inputs, each routed on its own to the least loaded replica (which one depends on the
  // machine's timing: under load all six went to one); both replicas give the same bits.
  const body = { model: QWEN3, input: TEXTS, encoding_format: "float" };
  const direct = await ok(a!.base, "/v1/embeddings", body);
  assertEquals(await ok(b!.base, "/v1/embeddings", body), direct);
  const routed = await ok(router.base, "/v1/embeddings", body);
  assertEquals(routed, direct);
  // base64, dimensions and ids as input: the same bits as the replica's own answer.
  for (
    const extra of [
      { encoding_format: "base64" },
      { dimensions: 16 },
      { input: [[1, 2, 3, 4], [5, 6]] },
    ]
  ) {
    const req = { ...body, ...extra };
    assertEquals(
      await ok(router.base, "/v1/embeddings", req),
      await ok(a!.base, "/v1/embeddings", req),
    );
  }
  // Ollama's /api/embed (its timings differ: only the vectors and counts are compared).
  const ollama = { model: QWEN3, input: TEXTS.slice(0, 3) };
  const [viaRouter, viaReplica] = await Promise.all([
    ok(router.base, "/api/embed", ollama),
    ok(b!.base, "/api/embed", ollama),
  ]);
  assertEquals(viaRouter.embeddings, viaReplica.embeddings);
  assertEquals(viaRouter.prompt_eval_count, viaReplica.prompt_eval_count);
  assertEquals(viaRouter.embeddings[0], direct.data[0].embedding);
  // Rerank: the same scores in the same order, asked in the replicas' --rerank-prompt.
  const rerank = {
    model: QWEN3,
    query: TEXTS[5],
    documents: TEXTS.slice(0, 5),
    top_n: 4,
    return_documents: true,
  };
  const ranked = await ok(router.base, "/v1/rerank", rerank);
  assertEquals(ranked, await ok(a!.base, "/v1/rerank", rerank));
  assertEquals(ranked.results.length, 4);

  // Batch lines of /v1/embeddings through the router: the vectors the route gives.
  const c = new OpenAI({ baseURL: `${router.base}/v1`, apiKey: "unused", maxRetries: 0 });
  const lines = TEXTS.map((t, i) =>
    JSON.stringify({
      custom_id: `e${i}`,
      method: "POST",
      url: "/v1/embeddings",
      body: { model: QWEN3, input: t, encoding_format: "float" },
    }) + "\n"
  ).join("");
  const file = await c.files.create({
    file: await toFile(new TextEncoder().encode(lines), "in.jsonl"),
    purpose: "batch",
  });
  const created = await c.batches.create({
    input_file_id: file.id,
    endpoint: "/v1/embeddings",
    completion_window: "24h",
  });
  let batch = created;
  await until("the batch to finish", async () => {
    batch = await c.batches.retrieve(created.id);
    return ["completed", "failed", "cancelled", "expired"].includes(batch.status);
  }, 120_000);
  assertEquals([batch.status, batch.request_counts?.completed], ["completed", TEXTS.length]);
  const out = (await (await c.files.content(batch.output_file_id!)).text()).split("\n")
    .filter(Boolean).map((l) => JSON.parse(l));
  assertEquals(out.length, TEXTS.length);
  for (const line of out) {
    const i = Number(line.custom_id.slice(1));
    assertEquals(line.response.status_code, 200);
    assertEquals(line.response.body.data[0].embedding, direct.data[i].embedding);
  }
  await Deno.remove(dataDir, { recursive: true });

  // Refusals name the input, as on a replica, and the router serves on.
  const tooLong = await post(router.base, "/v1/embeddings", {
    model: QWEN3,
    input: ["fine", "word ".repeat(200_000)],
  });
  assertEquals([tooLong.status, tooLong.body.error.param], [400, "input[1]"]);
  const badId = await post(router.base, "/v1/embeddings", { model: QWEN3, input: [[1], [1e9]] });
  assertEquals([badId.status, badId.body.error.param], [400, "input[1]"]);
  assertEquals(await ok(router.base, "/v1/embeddings", body), direct);
});

Deno.test("a router by model sends each model's embeddings to its replicas: each is that replica's own", async () => {
  await using cluster = await Cluster.start();
  const [q3, q2] = await Promise.all([
    cluster.replicaServing(replicaArgs(QWEN3)),
    cluster.replicaServing(replicaArgs(QWEN2)),
  ]);
  const router = await cluster.router(["--by-model"]);
  await until("the router to route both models", async () => {
    const h = await (await fetch(`${router.base}/health`)).json();
    return h.models?.[QWEN3]?.phase === "loaded" && h.models?.[QWEN2]?.phase === "loaded";
  }, 30_000);
  const answers = [];
  for (const [model, replica] of [[QWEN3, q3], [QWEN2, q2], [QWEN3, q3]] as const) {
    const body = { model, input: TEXTS.slice(0, 3), encoding_format: "float" };
    const routed = await ok(router.base, "/v1/embeddings", body);
    assertEquals(routed, await ok(replica.base, "/v1/embeddings", body));
    answers.push(routed);
  }
  assert(
    JSON.stringify(answers[0].data) !== JSON.stringify(answers[1].data),
    "the two models must embed differently for the test to tell them apart",
  );
  const unknown = await post(router.base, "/v1/embeddings", { model: "nope", input: "a" });
  assertEquals(unknown.status, 404);
});

/** 64 inputs of some 60 tokens each: long enough to kill a replica in the middle. */
const MANY = Array.from(
  { length: 64 },
  (_, i) => `Input number ${i}: ` + "the cat sat on the mat and looked at the dog. ".repeat(5),
);

Deno.test("a replica killed while it computes part of an embedding request: its inputs are asked of the other, and the answer is exact", async () => {
  await using cluster = await Cluster.start();
  const [a, b] = await Promise.all([
    cluster.replicaServing(replicaArgs(QWEN2)),
    cluster.replicaServing(replicaArgs(QWEN2)),
  ]);
  const router = await cluster.router();
  await cluster.routerSees(router, 2, 30_000);
  const body = { model: QWEN2, input: MANY, encoding_format: "float" };
  const answer = post(router.base, "/v1/embeddings", body);
  // Once b has answered one input it has more in hand (16 run at once, spread over two).
  await b!.logMatch(/NATS embed 200/);
  await cluster.kill(b as Member, "SIGKILL");
  const routed = await answer;
  assertEquals(routed.status, 200, JSON.stringify(routed.body));
  const metrics = await scrape(router.base);
  assertGreater(metricValue(metrics, "llm_router_embedding_retries_total") ?? 0, 0, metrics);
  assertEquals(routed.body, await ok(a!.base, "/v1/embeddings", body));
  const log = await router.logMatch(/embedding on \S+ lost \((\w+)/);
  assertStringIncludes(["timed_out", "replica_gone"].join(" "), log[1]!);
});
