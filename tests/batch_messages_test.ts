/**
 * The Batch API takes Anthropic's Messages as lines (`/v1/messages`): each line's answer is what
 * the route answers the same body (greedy), run at batch priority.
 */
// deno-lint-ignore no-import-prefix -- not in the import map (deno.json is the lead's); pinned here
import OpenAI, { toFile } from "npm:openai@7.59.0";
import { assertEquals } from "@std/assert";
import { startServer } from "./harness/server_process.ts";
import { compatPath } from "./harness/compat.ts";
import { until } from "./harness/uploads.ts";

Deno.test("Batch API: /v1/messages lines answer what the route answers", async () => {
  const dir = await Deno.makeTempDir({ prefix: "messages_batch_" });
  const srv = await startServer({
    args: [
      ...["--model", compatPath("tinyllama-like-q4_0"), "--backend", "cpu"],
      ...["--kv-memory", "8MiB", "--log-format", "off", "--data-dir", dir],
    ],
  });
  try {
    const c = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: "unused", maxRetries: 0 });
    const bodies = ["Tell me a story", "Hello there"].map((text) => ({
      model: "tinyllama-like-q4_0",
      max_tokens: 8,
      temperature: 0,
      messages: [{ role: "user", content: text }],
    }));
    const lines = bodies.map((body, i) =>
      JSON.stringify({ custom_id: `m${i}`, method: "POST", url: "/v1/messages", body }) + "\n"
    ).join("");
    const file = await c.files.create({
      file: await toFile(new TextEncoder().encode(lines), "in.jsonl"),
      purpose: "batch",
    });
    const created = await c.batches.create({
      input_file_id: file.id,
      endpoint: "/v1/messages" as "/v1/chat/completions",
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
    assertEquals([b.status, b.request_counts?.completed], ["completed", 2]);
    const out = (await (await c.files.content(b.output_file_id!)).text()).split("\n")
      .filter(Boolean).map((l) => JSON.parse(l));
    for (const line of out) {
      const i = Number(line.custom_id.slice(1));
      const direct = await fetch(`${srv.base}/v1/messages`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(bodies[i]),
      });
      const want = await direct.json();
      assertEquals(line.response.status_code, 200);
      assertEquals(line.response.body.type, "message");
      assertEquals(line.response.body.content, want.content);
    }
  } finally {
    await srv.stop();
    await Deno.remove(dir, { recursive: true });
  }
});
