/**
 * POST /v1/embeddings on the real server through the official openai client: float and base64
 * give llama-embedding's vectors (tests/fixtures/llama_cpp_embedding), `dimensions` cuts and
 * renormalizes, token-id inputs equal text inputs, and bad inputs get a 400 naming the field;
 * a server on the WebGPU engine serves them too.
 */
// deno-lint-ignore no-import-prefix -- not in the import map (deno.json is the lead's); pinned here
import OpenAI, { toFile } from "npm:openai@7.59.0";
import { assert, assertEquals } from "@std/assert";
import { startServer } from "./harness/server_process.ts";
import { compatPath } from "./harness/compat.ts";
import { until } from "./harness/uploads.ts";

interface Fixture {
  readonly prompts: readonly string[];
  readonly tokens: readonly (readonly number[])[];
  readonly mean: readonly (readonly number[])[];
}

const fx: Fixture = JSON.parse(
  await Deno.readTextFile(
    new URL("./fixtures/llama_cpp_embedding/qwen2-like.json", import.meta.url),
  ),
);

function cosineDistance(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let ab = 0, aa = 0, bb = 0;
  for (let i = 0; i < a.length; i++) (ab += a[i]! * b[i]!, aa += a[i]! ** 2, bb += b[i]! ** 2);
  return 1 - ab / Math.sqrt(aa * bb);
}

const norm = (v: readonly number[]) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

Deno.test("/v1/embeddings through the openai client: llama.cpp's vectors as float and base64, cut by dimensions, ids as text; bad inputs are 400s naming the field", async () => {
  const srv = await startServer({
    args: [
      ...["--model", compatPath("qwen2-like-q4_k_m"), "--backend", "cpu"],
      ...["--kv-memory", "8MiB", "--log-format", "off"],
    ],
  });
  try {
    const c = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: "unused", maxRetries: 0 });
    const model = "qwen2-like-q4_k_m";
    const asFloat = await c.embeddings.create({
      model,
      input: [...fx.prompts],
      encoding_format: "float",
    });
    assertEquals(asFloat.object, "list");
    assertEquals(asFloat.data.map((d) => d.index), [0, 1, 2]);
    assertEquals(asFloat.usage.prompt_tokens, fx.tokens.flat().length);
    asFloat.data.forEach((d, i) => {
      const dist = cosineDistance(d.embedding, fx.mean[i]!);
      assert(dist < 1e-3, `prompt ${i}: cosine distance ${dist} to llama.cpp's`);
    });
    // The client decodes base64 to the same floats (it asks for base64 when none is given).
    const asBase64 = await c.embeddings.create({ model, input: [...fx.prompts] });
    assertEquals(asBase64.data.map((d) => d.embedding), asFloat.data.map((d) => d.embedding));
    // Ids in, the same vector out.
    const byIds = await c.embeddings.create({
      model,
      input: [...fx.tokens[1]!],
      encoding_format: "float",
    });
    assertEquals(byIds.data[0]!.embedding, asFloat.data[1]!.embedding);
    // dimensions: the first 32 values, normalized again.
    const cut = await c.embeddings.create({
      model,
      input: fx.prompts[0]!,
      dimensions: 32,
      encoding_format: "float",
    });
    const first = asFloat.data[0]!.embedding.slice(0, 32);
    const want = first.map((x) => x / norm(first));
    cut.data[0]!.embedding.forEach((x, i) => assert(Math.abs(x - want[i]!) < 1e-6));

    const bad = async (body: unknown, param: string, status = 400) => {
      const r = await fetch(`${srv.base}/v1/embeddings`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      const j = await r.json();
      assertEquals([r.status, j.error.param], [status, param], JSON.stringify(j));
    };
    await bad({ model, input: "" }, "input");
    await bad({ model, input: ["a", ""] }, "input[1]");
    await bad({ model, input: [[1, 2], [999999]] }, "input[1]");
    await bad({ model, input: "a", dimensions: 100000 }, "dimensions");
    await bad({ model, input: "a", encoding_format: "int8" }, "encoding_format");
    await bad({ model: "nope", input: "a" }, "model", 404);
    await bad({ model, input: "x".repeat(200_000) }, "input");
    // The server goes on.
    const again = await c.embeddings.create({
      model,
      input: fx.prompts[2]!,
      encoding_format: "float",
    });
    assertEquals(again.data[0]!.embedding, asFloat.data[2]!.embedding);
  } finally {
    await srv.stop();
  }
});

Deno.test("Batch API: /v1/embeddings lines give the vectors the route gives", async () => {
  const dir = await Deno.makeTempDir({ prefix: "embeddings_batch_" });
  const srv = await startServer({
    args: [
      ...["--model", compatPath("qwen2-like-q4_k_m"), "--backend", "cpu"],
      ...["--kv-memory", "8MiB", "--log-format", "off", "--data-dir", dir],
    ],
  });
  try {
    const c = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: "unused", maxRetries: 0 });
    const lines = fx.prompts.map((p, i) =>
      JSON.stringify({
        custom_id: `e${i}`,
        method: "POST",
        url: "/v1/embeddings",
        body: { input: p, encoding_format: "float" },
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
    let b = created;
    await until(
      async () => {
        b = await c.batches.retrieve(created.id);
        return ["completed", "failed", "cancelled", "expired"].includes(b.status);
      },
      "the batch to finish",
      120_000,
    );
    assertEquals([b.status, b.request_counts?.completed], ["completed", 3]);
    const out = (await (await c.files.content(b.output_file_id!)).text()).split("\n")
      .filter(Boolean).map((l) => JSON.parse(l));
    const direct = await c.embeddings.create({
      input: [...fx.prompts],
      encoding_format: "float",
      model: "qwen2-like-q4_k_m",
    });
    for (const line of out) {
      const i = Number(line.custom_id.slice(1));
      assertEquals(line.response.status_code, 200);
      assertEquals(line.response.body.data[0].embedding, direct.data[i]!.embedding);
    }
  } finally {
    await srv.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("--backend webgpu serves /v1/embeddings and Ollama's /api/embed: llama.cpp's vectors, the same through both routes", async () => {
  const srv = await startServer({
    args: [
      ...["--model", compatPath("qwen2-like-q4_k_m"), "--backend", "webgpu"],
      ...["--kv-memory", "8MiB", "--log-format", "off"],
    ],
    // llvmpipe compiles the pipelines at start.
    startTimeoutMs: 180_000,
  });
  try {
    assert(/backend\s+webgpu \(/.test(srv.log()), `not on the WebGPU engine:\n${srv.log()}`);
    const c = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: "unused", maxRetries: 0 });
    const model = "qwen2-like-q4_k_m";
    const got = await c.embeddings.create({
      model,
      input: [...fx.prompts],
      encoding_format: "float",
    });
    assertEquals(got.usage.prompt_tokens, fx.tokens.flat().length);
    got.data.forEach((d, i) => {
      const dist = cosineDistance(d.embedding, fx.mean[i]!);
      assert(dist < 1e-3, `prompt ${i}: cosine distance ${dist} to llama.cpp's`);
    });
    const r = await fetch(`${srv.base}/api/embed`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model, input: [...fx.prompts] }),
    });
    assertEquals(r.status, 200);
    assertEquals((await r.json()).embeddings, got.data.map((d) => d.embedding));
  } finally {
    await srv.stop();
  }
});
