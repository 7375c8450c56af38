/**
 * The batch queue end to end, on the real server (main.ts serve, reference engine,
 * stories260K) as a child process with --data-dir in a temp dir, driven through the official
 * openai client: every batch line's answer equals the same request sent alone over HTTP, a
 * bad line's error equals the same bad request's, kill -9 mid-batch loses and duplicates
 * nothing, limits and cancel.
 */
// deno-lint-ignore no-import-prefix -- not in the import map (deno.json is the lead's); pinned here
import OpenAI, { toFile } from "npm:openai@7.59.0";
import { assert, assertEquals, assertGreater, assertLess, assertRejects } from "@std/assert";
import { type ServerProcess, startServer } from "./harness/server_process.ts";
import { derivedSeed } from "../lib/batch/batch_lines.ts";
import { modelFile } from "./harness/model_files.ts";

const MODEL_ARGS = [
  "--model",
  modelFile("stories260K.bin"),
  "--tokenizer",
  modelFile("tok512.bin"),
  "--backend",
  "reference",
  "--kv-memory",
  "8MiB",
  "--log-format",
  "off",
];

function server(dataDir: string, extra: string[] = []): Promise<ServerProcess> {
  return startServer({ args: [...MODEL_ARGS, "--data-dir", dataDir, ...extra] });
}

function client(base: string): OpenAI {
  return new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 });
}

const STARTS = ["Once upon a time", "Tom and his dog", "The little cat", "Lily went to the park"];

/** 200 completion lines: greedy, seeded and unseeded sampled, of several lengths. */
function lines(
  n: number,
  maxTokens: number,
): Array<{ custom_id: string; body: Record<string, unknown> }> {
  return Array.from({ length: n }, (_, i) => {
    const body: Record<string, unknown> = {
      prompt: `${STARTS[i % STARTS.length]}${" and".repeat(i % 3)}`,
      max_tokens: maxTokens - (i % 4),
    };
    if (i % 3 === 0) body.temperature = 0;
    else if (i % 3 === 1) Object.assign(body, { temperature: 0.9, seed: 1000 + i });
    else body.temperature = 1; // no seed: the queue derives one from the batch id and index
    return { custom_id: `line-${i}`, body };
  });
}

function jsonl(
  rows: Array<{ custom_id: string; body: Record<string, unknown> }>,
  url = "/v1/completions",
): string {
  return rows.map((r) =>
    JSON.stringify({ custom_id: r.custom_id, method: "POST", url, body: r.body })
  )
    .join("\n") + "\n";
}

async function upload(c: OpenAI, text: string) {
  return await c.files.create({
    file: await toFile(new TextEncoder().encode(text), "input.jsonl"),
    purpose: "batch",
  });
}

async function waitForBatch(
  c: OpenAI,
  id: string,
  done: (b: OpenAI.Batch) => boolean,
  timeoutMs = 120_000,
) {
  const end = performance.now() + timeoutMs;
  for (;;) {
    const b = await c.batches.retrieve(id);
    if (done(b)) return b;
    if (performance.now() > end) {
      throw new Error(`batch ${id} still ${b.status}: ${JSON.stringify(b.request_counts)}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

const finished = (b: OpenAI.Batch) =>
  ["completed", "failed", "cancelled", "expired"].includes(b.status);

interface OutputRow {
  id: string;
  custom_id: string;
  response: { status_code: number; request_id: string; body: any } | null;
  error: { code: string; message: string } | null;
}

async function fileRows(c: OpenAI, id: string | null | undefined): Promise<OutputRow[]> {
  if (id === null || id === undefined) return [];
  const text = await (await c.files.content(id)).text();
  return text.split("\n").filter((l) => l !== "").map((l) => JSON.parse(l));
}

/** The same request sent alone over HTTP: status and body. */
async function alone(base: string, url: string, body: Record<string, unknown>) {
  const res = await fetch(`${base}${url}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

/** What a batch line's answer must equal: the text, the finish and the counts alone. */
function answer(body: any) {
  return {
    text: body.choices[0].text ?? body.choices[0].message.content,
    finish: body.choices[0].finish_reason,
    prompt_tokens: body.usage.prompt_tokens,
    completion_tokens: body.usage.completion_tokens,
  };
}

/** Sends each line alone (8 at a time) with the seed the batch gave it, and compares. */
async function assertEqualsAlone(
  base: string,
  batchId: string,
  rows: Array<{ custom_id: string; body: Record<string, unknown> }>,
  output: OutputRow[],
): Promise<void> {
  const byId = new Map(output.map((o) => [o.custom_id, o]));
  let next = 0;
  const worker = async () => {
    while (next < rows.length) {
      const i = next++;
      const row = rows[i]!;
      const got = byId.get(row.custom_id);
      if (got === undefined) throw new Error(`${row.custom_id} is missing from the output`);
      assertEquals(got.response!.status_code, 200);
      const body = row.body.seed === undefined
        ? { ...row.body, seed: derivedSeed(batchId, i) }
        : row.body;
      const ref = await alone(base, "/v1/completions", body);
      assertEquals(ref.status, 200);
      assertEquals(answer(got.response!.body), answer(ref.body), row.custom_id);
    }
  };
  await Promise.all(Array.from({ length: 8 }, worker));
}

/** Streams greedy chat completions one after another until `stop` is set; returns how many. */
async function interactiveStream(
  base: string,
  k: number,
  stop: { done: boolean },
): Promise<number> {
  const c = client(base);
  let n = 0;
  while (!stop.done) {
    const stream = await c.chat.completions.create({
      model: "stories260K",
      messages: [{ role: "user", content: `${STARTS[k % STARTS.length]} ${k}` }],
      max_tokens: 8,
      temperature: 0,
      stream: true,
    });
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
    assertGreater(text.length, 0);
    n++;
  }
  return n;
}

Deno.test("a batch of 200 lines beside 8 interactive streams: every answer equals the same request sent alone", async () => {
  const dir = await Deno.makeTempDir({ prefix: "batch_test_" });
  const srv = await server(dir, ["--batch-concurrency", "4"]);
  try {
    const c = client(srv.base);
    const rows = lines(200, 10);
    const file = await upload(c, jsonl(rows));
    assertEquals(file.purpose, "batch");
    assertEquals(file.bytes, new TextEncoder().encode(jsonl(rows)).length);
    const stop = { done: false };
    const streams = Array.from({ length: 8 }, (_, k) => interactiveStream(srv.base, k, stop));
    const created = await c.batches.create({
      input_file_id: file.id,
      endpoint: "/v1/completions",
      completion_window: "24h",
      metadata: { purpose: "test" },
    });
    assertEquals(created.request_counts?.total, 200);
    assertEquals(created.metadata, { purpose: "test" });
    const b = await waitForBatch(c, created.id, finished);
    stop.done = true;
    const served = await Promise.all(streams);
    assertEquals(b.status, "completed");
    assertEquals(b.request_counts, { total: 200, completed: 200, failed: 0 });
    assertEquals(b.error_file_id, null);
    for (const n of served) assertGreater(n, 0);
    const output = await fileRows(c, b.output_file_id);
    assertEquals(output.length, 200);
    assertEquals(output.map((o) => o.custom_id), rows.map((r) => r.custom_id));
    for (const o of output) {
      assertEquals(o.error, null);
      assertEquals(o.response!.request_id, o.response!.body.id);
    }
    await assertEqualsAlone(srv.base, created.id, rows, output);
    // Listed, newest first, through the client's pagination.
    const page = await c.batches.list({ limit: 10 });
    assertEquals(page.data.map((x) => x.id), [created.id]);
  } finally {
    await srv.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("kill -9 in the middle of a batch, restart: it completes with no line lost or duplicated, each equal to the request alone", async () => {
  const dir = await Deno.makeTempDir({ prefix: "batch_test_" });
  const rows = lines(200, 12);
  let srv = await server(dir, ["--batch-concurrency", "2"]);
  let batchId: string;
  try {
    const c = client(srv.base);
    const file = await upload(c, jsonl(rows));
    batchId = (await c.batches.create({
      input_file_id: file.id,
      endpoint: "/v1/completions",
      completion_window: "24h",
    })).id;
    const mid = await waitForBatch(c, batchId, (b) => (b.request_counts?.completed ?? 0) >= 40);
    await srv.stop("SIGKILL");
    assertLess(mid.request_counts!.completed, 200, "the kill came before the end");
  } catch (e) {
    await srv.stop("SIGKILL");
    throw e;
  }
  srv = await server(dir, ["--batch-concurrency", "4"]);
  try {
    const c = client(srv.base);
    const b = await waitForBatch(c, batchId, finished);
    assertEquals(b.status, "completed");
    assertEquals(b.request_counts, { total: 200, completed: 200, failed: 0 });
    const output = await fileRows(c, b.output_file_id);
    assertEquals(output.length, 200, "no line lost or duplicated");
    assertEquals(output.map((o) => o.custom_id), rows.map((r) => r.custom_id));
    assertEquals(new Set(output.map((o) => o.id)).size, 200);
    await assertEqualsAlone(srv.base, batchId, rows, output);
  } finally {
    await srv.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("bad lines get the error the same HTTP request gets, in the error file, and the batch goes on", async () => {
  const dir = await Deno.makeTempDir({ prefix: "batch_test_" });
  const srv = await server(dir);
  try {
    const c = client(srv.base);
    const bad: Array<{ custom_id: string; body: Record<string, unknown> }> = [
      {
        custom_id: "good",
        body: { messages: [{ role: "user", content: "Hi" }], max_tokens: 4, temperature: 0 },
      },
      { custom_id: "hot", body: { messages: [{ role: "user", content: "Hi" }], temperature: 5 } },
      { custom_id: "typo", body: { messages: [{ role: "user", content: "Hi" }], max_token: 4 } },
      {
        custom_id: "long",
        body: { messages: [{ role: "user", content: "Once upon a time ".repeat(400) }] },
      },
      { custom_id: "nomsg", body: { max_tokens: 4 } },
      // > 0 as a double, 0 as the engine's f32: a 400 like the same request alone.
      {
        custom_id: "f32",
        body: { messages: [{ role: "user", content: "Hi" }], repetition_penalty: 1e-300 },
      },
      {
        custom_id: "model",
        body: { model: "gpt-4o", messages: [{ role: "user", content: "Hi" }] },
      },
    ];
    const file = await upload(c, jsonl(bad, "/v1/chat/completions"));
    const listed = await c.files.list({ purpose: "batch" });
    assertEquals(listed.data.map((f) => f.id), [file.id]);
    assertEquals((await c.files.retrieve(file.id)).bytes, file.bytes);
    const created = await c.batches.create({
      input_file_id: file.id,
      endpoint: "/v1/chat/completions",
      completion_window: "24h",
    });
    const b = await waitForBatch(c, created.id, finished);
    assertEquals(b.status, "completed");
    assertEquals(b.request_counts, { total: 7, completed: 1, failed: 6 });
    const out = await fileRows(c, b.output_file_id);
    assertEquals(out.map((o) => o.custom_id), ["good"]);
    const errors = await fileRows(c, b.error_file_id);
    assertEquals(errors.map((o) => o.custom_id), ["hot", "typo", "long", "nomsg", "f32", "model"]);
    for (const e of errors) {
      const row = bad.find((r) => r.custom_id === e.custom_id)!;
      const ref = await alone(srv.base, "/v1/chat/completions", row.body);
      assertGreater(ref.status, 399);
      assertLess(ref.status, 500);
      assertEquals(e.response!.status_code, ref.status, e.custom_id);
      assertEquals(e.response!.body, ref.body, e.custom_id);
      assertEquals(e.error, null);
    }
    const f32 = errors.find((e) => e.custom_id === "f32")!.response!;
    assertEquals([f32.status_code, f32.body.error.param], [400, "repetition_penalty"]);
    // A line that is not JSON is refused at upload, naming it; nothing is stored.
    const notJson = await assertRejects(
      () => upload(c, `${JSON.stringify({ custom_id: "a" })}\n{not json\n`),
      OpenAI.APIError,
    );
    assertEquals(notJson.status, 400);
    assert(notJson.message.includes("Line 2 is not valid JSON"), notJson.message);
    assertEquals((await c.files.list({ purpose: "batch" })).data.map((f) => f.id), [file.id]);
    // A structurally broken file fails the whole batch at validation, naming each line.
    const broken = [
      JSON.stringify({ custom_id: "a", method: "POST", url: "/v1/chat/completions", body: {} }),
      JSON.stringify({ custom_id: "a", method: "POST", url: "/v1/chat/completions", body: {} }),
      JSON.stringify({ custom_id: "b", method: "POST", url: "/v1/completions", body: {} }),
      JSON.stringify({ custom_id: "c", method: "GET", url: "/v1/chat/completions", body: {} }),
    ].join("\n");
    const f2 = await upload(c, broken);
    const failed = await c.batches.create({
      input_file_id: f2.id,
      endpoint: "/v1/chat/completions",
      completion_window: "24h",
    });
    assertEquals(failed.status, "failed");
    assertEquals(
      failed.errors!.data!.map((e) => [e.line, e.code]),
      [[2, "duplicate_custom_id"], [3, "mismatched_url"], [4, "invalid_method"]],
    );
    assertEquals((await c.batches.retrieve(failed.id)).status, "failed");
  } finally {
    await srv.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("limits: file size, line count and unfinished batches are refused with 4xx naming the limit; cancel", async () => {
  const dir = await Deno.makeTempDir({ prefix: "batch_test_" });
  const srv = await server(dir, [
    "--batch-max-file-size",
    "2KiB",
    "--batch-max-lines",
    "8",
    "--batch-max-active",
    "1",
    "--batch-concurrency",
    "1",
  ]);
  try {
    const c = client(srv.base);
    const big = jsonl(Array.from({ length: 6 }, (_, i) => ({
      custom_id: `x${i}`,
      body: { prompt: "y".repeat(400), max_tokens: 1 },
    })));
    assertGreater(big.length, 2048);
    const e413 = await assertRejects(() => upload(c, big), OpenAI.APIError);
    assertEquals(e413.status, 413);
    assert(e413.message.includes("2048"), e413.message);
    const nine = jsonl(lines(9, 4));
    const e400 = await assertRejects(() => upload(c, nine), OpenAI.APIError);
    assertEquals(e400.status, 400);
    assert(e400.message.includes("9 request lines") && e400.message.includes("8"), e400.message);
    const purpose = await fetch(`${srv.base}/v1/files`, {
      method: "POST",
      body: (() => {
        const f = new FormData();
        f.append("purpose", "fine-tune");
        f.append("file", new Blob(["{}\n"]), "x.jsonl");
        return f;
      })(),
    });
    assertEquals(purpose.status, 400);
    assertEquals((await purpose.json()).error.param, "purpose");
    const missing = await assertRejects(
      () =>
        c.batches.create({
          input_file_id: "file-nope",
          endpoint: "/v1/completions",
          completion_window: "24h",
        }),
      OpenAI.APIError,
    );
    assertEquals(missing.status, 404);
    const endpoint = await fetch(`${srv.base}/v1/batches`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        input_file_id: "file-x",
        endpoint: "/v1/moderations",
        completion_window: "24h",
      }),
    });
    assertEquals(endpoint.status, 400);
    assertEquals((await endpoint.json()).error.param, "endpoint");

    // One unfinished batch is the limit: a second is refused until the first is cancelled.
    const slow = await upload(
      c,
      jsonl(Array.from({ length: 8 }, (_, i) => ({
        custom_id: `s${i}`,
        body: { prompt: "Once upon a time", max_tokens: 200, temperature: 0 },
      }))),
    );
    const first = await c.batches.create({
      input_file_id: slow.id,
      endpoint: "/v1/completions",
      completion_window: "24h",
    });
    const e429 = await assertRejects(
      () =>
        c.batches.create({
          input_file_id: slow.id,
          endpoint: "/v1/completions",
          completion_window: "24h",
        }),
      OpenAI.APIError,
    );
    assertEquals(e429.status, 429);
    assert(e429.message.includes("--batch-max-active 1"), e429.message);
    await waitForBatch(c, first.id, (b) => (b.request_counts?.completed ?? 0) >= 1);
    const cancelling = await c.batches.cancel(first.id);
    assert(["cancelling", "cancelled"].includes(cancelling.status), cancelling.status);
    const cancelled = await waitForBatch(c, first.id, finished);
    assertEquals(cancelled.status, "cancelled");
    const done = cancelled.request_counts!.completed;
    assertGreater(done, 0);
    assertLess(done, 8);
    assertEquals((await fileRows(c, cancelled.output_file_id)).length, done);
    const again = await assertRejects(() => c.batches.cancel(first.id), OpenAI.APIError);
    assertEquals(again.status, 409);
    // The slot is free again.
    const second = await c.batches.create({
      input_file_id: slow.id,
      endpoint: "/v1/completions",
      completion_window: "24h",
    });
    assertEquals(second.status, "in_progress");
    await c.batches.cancel(second.id);
    await waitForBatch(c, second.id, finished);
    const notFound = await fetch(`${srv.base}/v1/batches/batch_missing`);
    assertEquals(notFound.status, 404);
    await notFound.body?.cancel();
  } finally {
    await srv.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("with API keys, one key's files and batches are not another key's to see", async () => {
  const dir = await Deno.makeTempDir({ prefix: "batch_test_" });
  const srv = await server(dir, ["--api-key", "key-one-123", "--api-key", "key-two-456"]);
  try {
    const one = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: "key-one-123", maxRetries: 0 });
    const two = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: "key-two-456", maxRetries: 0 });
    const file = await upload(one, jsonl(lines(3, 4)));
    const created = await one.batches.create({
      input_file_id: file.id,
      endpoint: "/v1/completions",
      completion_window: "24h",
    });
    const b = await waitForBatch(one, created.id, finished);
    assertEquals(b.status, "completed");
    assertEquals((await fileRows(one, b.output_file_id)).length, 3);
    for (
      const attempt of [
        () => two.batches.retrieve(created.id),
        () => two.batches.cancel(created.id),
        () => two.files.retrieve(file.id),
        () => two.files.content(b.output_file_id!),
        () =>
          two.batches.create({
            input_file_id: file.id,
            endpoint: "/v1/completions",
            completion_window: "24h",
          }),
      ]
    ) {
      const e = await assertRejects(attempt, OpenAI.APIError);
      assertEquals(e.status, 404);
    }
    assertEquals((await two.batches.list()).data, []);
    assertEquals((await two.files.list()).data, []);
    assertEquals((await one.batches.list()).data.map((x) => x.id), [created.id]);
    const anonymous = await fetch(`${srv.base}/v1/batches/${created.id}`);
    assertEquals(anonymous.status, 401);
    await anonymous.body?.cancel();
  } finally {
    await srv.stop();
    await Deno.remove(dir, { recursive: true });
  }
});
