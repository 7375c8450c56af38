/**
 * DELETE /v1/files/{id} and the life of a batch's files, on the real server through the
 * official openai client: the input of an unfinished batch answers 409; output and error
 * files are one copy on disk (their batch's results log); --batch-retention removes a finished
 * batch's files.
 */
// deno-lint-ignore no-import-prefix -- not in the import map (deno.json is the lead's); pinned here
import OpenAI, { toFile } from "npm:openai@7.59.0";
import { assert, assertEquals, assertRejects } from "@std/assert";
import { type ServerProcess, startServer } from "./harness/server_process.ts";
import { modelFile } from "./harness/model_files.ts";
import { filesIn, until } from "./harness/uploads.ts";

function server(dataDir: string, extra: string[] = []): Promise<ServerProcess> {
  return startServer({
    args: [
      ...["--model", modelFile("stories260K.bin"), "--tokenizer", modelFile("tok512.bin")],
      ...["--backend", "reference", "--kv-memory", "8MiB", "--log-format", "off"],
      ...["--data-dir", dataDir, ...extra],
    ],
  });
}

function jsonl(n: number, maxTokens: number, bad = 0): string {
  return Array.from({ length: n }, (_, i) =>
    JSON.stringify({
      custom_id: `r${i}`,
      method: "POST",
      url: "/v1/completions",
      // The first `bad` lines ask for a temperature the API refuses: they go to the error file.
      body: { prompt: "Once upon a time", max_tokens: maxTokens, temperature: i < bad ? 9 : 0 },
    }) + "\n").join("");
}

async function upload(c: OpenAI, text: string) {
  return await c.files.create({
    file: await toFile(new TextEncoder().encode(text), "input.jsonl"),
    purpose: "batch",
  });
}

async function finished(c: OpenAI, id: string): Promise<OpenAI.Batch> {
  let b = await c.batches.retrieve(id);
  await until(
    async () => {
      b = await c.batches.retrieve(id);
      return ["completed", "failed", "cancelled", "expired"].includes(b.status);
    },
    `batch ${id} to finish`,
    120_000,
  );
  return b;
}

Deno.test("DELETE: 409 for an unfinished batch's input, OpenAI's answer otherwise; output and error files are the results log's one copy", async () => {
  const dir = await Deno.makeTempDir({ prefix: "batch_routes_test_" });
  const srv = await server(dir, ["--batch-concurrency", "1"]);
  try {
    const c = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: "unused", maxRetries: 0 });
    const input = await upload(c, jsonl(6, 150, 2));
    const created = await c.batches.create({
      input_file_id: input.id,
      endpoint: "/v1/completions",
      completion_window: "24h",
    });
    const busy = await assertRejects(() => c.files.delete(input.id), OpenAI.APIError);
    assertEquals(busy.status, 409);
    assert(busy.message.includes(created.id), busy.message);
    const b = await finished(c, created.id);
    assertEquals(b.request_counts, { total: 6, completed: 4, failed: 2 });

    // On disk: the input's content and object, the outputs' objects only, and the one log.
    const names = await filesIn(dir);
    assertEquals(names.filter((n) => n.endsWith(".jsonl")), [`${input.id}.jsonl`]);
    assertEquals(names.length, 4);
    const log = await Deno.readTextFile(`${dir}/batches/${created.id}.results.jsonl`);
    const records = log.split("\n").filter(Boolean).map((l) => JSON.parse(l));
    assertEquals(records.length, 6);
    for (
      const [id, ok, n] of [[b.output_file_id!, true, 4], [b.error_file_id!, false, 2]] as const
    ) {
      const text = await (await c.files.content(id)).text();
      const want = records.filter((r) => r.ok === ok).sort((x, y) => x.index - y.index)
        .map((r) => JSON.stringify(r.line) + "\n").join("");
      assertEquals(text, want);
      assertEquals(text.split("\n").filter(Boolean).length, n);
      assertEquals((await c.files.retrieve(id)).bytes, new TextEncoder().encode(text).length);
    }

    // Finished: the input deletes. Deleting both outputs removes the log too.
    assertEquals(await c.files.delete(input.id), { id: input.id, object: "file", deleted: true });
    assertEquals((await c.files.delete(b.output_file_id!)).deleted, true);
    assertEquals((await c.files.content(b.error_file_id!).then((r) => r.text())).length > 0, true);
    assertEquals((await c.files.delete(b.error_file_id!)).deleted, true);
    assertEquals(await filesIn(dir), []);
    assertEquals(
      (await Array.fromAsync(Deno.readDir(`${dir}/batches`))).map((e) => e.name),
      [`${created.id}.json`],
    );
    const gone = await assertRejects(() => c.files.content(b.output_file_id!), OpenAI.APIError);
    assertEquals(gone.status, 404);
  } finally {
    await srv.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("--batch-retention: a finished batch's input, output and error files go once it has passed; the batch stays", async () => {
  const dir = await Deno.makeTempDir({ prefix: "batch_routes_test_" });
  const srv = await server(dir, ["--batch-retention", "1s"]);
  try {
    const c = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: "unused", maxRetries: 0 });
    const input = await upload(c, jsonl(3, 4, 1));
    const unused = await upload(c, jsonl(1, 4));
    const created = await c.batches.create({
      input_file_id: input.id,
      endpoint: "/v1/completions",
      completion_window: "24h",
    });
    const b = await finished(c, created.id);
    assertEquals(b.request_counts, { total: 3, completed: 2, failed: 1 });
    await until(
      async () => (await c.files.list()).data.map((f) => f.id).join() === unused.id,
      "the batch's files to expire",
    );
    for (const id of [input.id, b.output_file_id!, b.error_file_id!]) {
      const e = await assertRejects(() => c.files.retrieve(id), OpenAI.APIError);
      assertEquals(e.status, 404);
    }
    assertEquals(await filesIn(dir), [`${unused.id}.json`, `${unused.id}.jsonl`]);
    assertEquals((await c.batches.retrieve(created.id)).status, "completed");
    assertEquals(
      (await Array.fromAsync(Deno.readDir(`${dir}/batches`))).map((e) => e.name),
      [`${created.id}.json`],
    );
  } finally {
    await srv.stop();
    await Deno.remove(dir, { recursive: true });
  }
});
