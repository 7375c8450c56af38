/**
 * `router --by-model` over two replicas serving different models: each request goes to a
 * replica of the model it names (its answer is `generate`'s for that file), /v1/models lists
 * both, and an unknown model is a 404 naming them.
 */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { compatPath, generateAlone as generateCompat } from "./harness/compat.ts";
import { Cluster, until } from "./_cluster.ts";
import { assertRefusesInvalidUtf8, invalidUtf8Completion } from "./_http_harness.ts";

const A = "stories260K-q4_1";
const B = "tinyllama-like-q4_0";
const PROMPT = "Once upon a time";
const N = 8;

const generateAlone = (stem: string) => generateCompat(stem, PROMPT, N);

const replicaArgs = (stem: string) => [
  "--model",
  compatPath(stem),
  "--backend",
  "cpu",
  "--kv-memory",
  "2MiB",
  "--max-running",
  "4",
];

Deno.test("a router by model sends each request to a replica of its model", async () => {
  await using cluster = await Cluster.start();
  const [oracleA, oracleB] = await Promise.all([generateAlone(A), generateAlone(B)]);
  await Promise.all([
    cluster.replicaServing(replicaArgs(A)),
    cluster.replicaServing(replicaArgs(B)),
  ]);
  const router = await cluster.router(["--by-model"]);
  const complete = async (model: string) => {
    const res = await fetch(`${router.base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model, prompt: PROMPT, max_tokens: N, temperature: 0 }),
    });
    return { status: res.status, body: await res.json() };
  };
  await until("the router to route both models", async () => {
    const h = await (await fetch(`${router.base}/health`)).json();
    return h.models?.[A]?.phase === "loaded" && h.models?.[B]?.phase === "loaded";
  }, 30_000);
  const list = await (await fetch(`${router.base}/v1/models`)).json();
  assertEquals(list.data.map((m: { id: string }) => m.id).sort(), [A, B].sort());
  for (const [model, oracle] of [[A, oracleA], [B, oracleB], [B, oracleB], [A, oracleA]]) {
    const r = await complete(model!);
    assertEquals(r.status, 200, JSON.stringify(r.body));
    assertEquals(r.body.model, model);
    assertEquals(r.body.choices[0].text, oracle);
  }
  assert(
    oracleA !== oracleB,
    "the two models must answer differently for the test to tell them apart",
  );
  const unknown = await complete("no-such-model");
  assertEquals(unknown.status, 404);
  assertEquals(unknown.body.error.code, "model_not_found");
  assertStringIncludes(unknown.body.error.message, `"${A}"`);
  assertStringIncludes(unknown.body.error.message, `"${B}"`);
  // Each model's requests are counted under its label.
  const metrics = await (await fetch(`${router.base}/metrics`)).text();
  for (const m of [A, B]) {
    assert(
      metrics.includes(
        `llm_http_requests_total{model="${m}",method="POST",route="/v1/completions",status="200"} 2`,
      ),
      metrics.split("\n").filter((l) => l.startsWith("llm_http_requests_total")).join("\n"),
    );
  }
});

Deno.test("a router by model refuses a body that is not UTF-8 with a 400, and serves on", async () => {
  await using cluster = await Cluster.start();
  const oracle = await generateAlone(A);
  await cluster.replicaServing(replicaArgs(A));
  const router = await cluster.router(["--by-model"]);
  await until("the router to route the model", async () => {
    const h = await (await fetch(`${router.base}/health`)).json();
    return h.models?.[A]?.phase === "loaded";
  }, 30_000);
  await assertRefusesInvalidUtf8(
    await fetch(`${router.base}/v1/completions`, invalidUtf8Completion(A)),
  );
  // The same request in valid UTF-8 is served: the refusal was about the bytes alone.
  const res = await fetch(`${router.base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: A, prompt: PROMPT, max_tokens: N, temperature: 0 }),
  });
  assertEquals(res.status, 200);
  assertEquals((await res.json()).choices[0].text, oracle);
  // The 400 is the front's own: the model's route (and so no replica) never saw the request.
  const metrics = await (await fetch(`${router.base}/metrics`)).text();
  assert(
    metrics.includes(
      `llm_http_requests_total{model="${A}",method="POST",route="/v1/completions",status="200"} 1`,
    ) && !metrics.includes(`model="${A}",method="POST",route="/v1/completions",status="400"`),
    metrics.split("\n").filter((l) => l.startsWith("llm_http_requests_total")).join("\n"),
  );
});
