/**
 * The Batch API through a router: the router keeps the files and batches in its own data
 * folder and sends each line through its routing, so one batch spreads over every replica; a
 * router restarted on the same folder resumes it. Checked with the official `openai` client
 * over real nats-server, replicas and router processes, each line's text against the CPU
 * reference engine's greedy text.
 */
// deno-lint-ignore no-import-prefix -- the official client, pinned as the other tests pin it
import OpenAI, { toFile } from "npm:openai@7.59.0";
import { assertEquals, assertGreater } from "@std/assert";
import { loadModel } from "../lib/model/load_model.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { referenceGenerate } from "../kernels/reference/reference_generate.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { modelFile } from "./harness/model_files.ts";
import { metricValue, scrape } from "./_http_harness.ts";
import { Cluster } from "./_cluster.ts";

const model = await loadModel(modelFile("stories260K.bin"), {
  tokenizerPath: modelFile("tok512.bin"),
});
const tokenizer = new Tokenizer(model.tokenizer!);
const KV = ["--kv-memory", "8MiB", "--max-batch-tokens", "128"];
const PROMPTS = ["Once upon a time", "The little dog", "One day, a girl", "Tom had a red ball"];

/** Greedy text of one sequence alone on the CPU engine (stops at EOS or BOS, as the server). */
async function greedyText(prompt: string, maxTokens: number): Promise<string> {
  const ids = tokenizer.encode(prompt, { bos: true });
  const engine = new CpuEngine(model.config, model.weights, { numBlocks: 64, blockSize: 16 });
  const stops = [tokenizer.eosId, tokenizer.bosId];
  const { tokens } = await referenceGenerate(engine, ids, maxTokens, GREEDY, { stopTokens: stops });
  const out = stops.includes(tokens.at(-1)!) ? tokens.slice(0, -1) : tokens;
  const dec = tokenizer.createDecoder({ afterBos: ids.at(-1) === tokenizer.bosId });
  return out.map((t) => dec.push(t)).join("") + dec.flush();
}

function jsonl(n: number, maxTokens: number): string {
  return Array.from({ length: n }, (_, i) =>
    JSON.stringify({
      custom_id: `line-${i}`,
      method: "POST",
      url: "/v1/completions",
      body: { prompt: PROMPTS[i % PROMPTS.length], max_tokens: maxTokens, temperature: 0 },
    })).join("\n") + "\n";
}

async function finishedBatch(c: OpenAI, id: string): Promise<OpenAI.Batch> {
  const end = performance.now() + 180_000;
  for (;;) {
    const b = await c.batches.retrieve(id);
    if (["completed", "failed", "cancelled", "expired"].includes(b.status)) return b;
    if (performance.now() > end) throw new Error(`batch ${id} still ${b.status}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function outputTexts(c: OpenAI, id: string): Promise<Map<string, string>> {
  const text = await (await c.files.content(id)).text();
  const rows = text.split("\n").filter((l) => l !== "").map((l) => JSON.parse(l));
  return new Map(rows.map((r) => [r.custom_id, r.response.body.choices[0].text]));
}

/** Decode steps a replica's engine ran (its own work, however the request reached it). */
const steps = async (base: string) => metricValue(await scrape(base), "llm_steps_total") ?? 0;

Deno.test("a batch through the router spreads its lines over the replicas, exact, and resumes after a router restart", async () => {
  await using cluster = await Cluster.start();
  const replicas = await Promise.all([0, 1].map(() => cluster.replica(KV)));
  const dataDir = await Deno.makeTempDir({ prefix: "router_batches_" });
  try {
    let router = await cluster.router(["--routing", "round-robin", "--data-dir", dataDir]);
    await cluster.routerSees(router, 2);
    let c = new OpenAI({ baseURL: router.base + "/v1", apiKey: "unused", maxRetries: 0 });
    const before = await Promise.all(replicas.map((r) => steps(r.base)));
    const expected = new Map(
      await Promise.all(PROMPTS.map(async (p) => [p, await greedyText(p, 24)] as const)),
    );
    const file = await c.files.create({
      file: await toFile(new TextEncoder().encode(jsonl(16, 24)), "input.jsonl"),
      purpose: "batch",
    });
    const created = await c.batches.create({
      input_file_id: file.id,
      endpoint: "/v1/completions",
      completion_window: "24h",
    });
    const b = await finishedBatch(c, created.id);
    assertEquals(b.status, "completed");
    assertEquals(b.request_counts, { total: 16, completed: 16, failed: 0 });
    const texts = await outputTexts(c, b.output_file_id!);
    for (let i = 0; i < 16; i++) {
      assertEquals(texts.get(`line-${i}`), expected.get(PROMPTS[i % PROMPTS.length]!), `line-${i}`);
    }
    // Both replicas ran lines of it.
    for (const [i, r] of replicas.entries()) assertGreater(await steps(r.base), before[i]!, r.base);

    // A router killed mid-batch and started again on its folder finishes the batch: every line
    // once, each exact.
    const long = await c.files.create({
      file: await toFile(new TextEncoder().encode(jsonl(24, 120)), "long.jsonl"),
      purpose: "batch",
    });
    const second = await c.batches.create({
      input_file_id: long.id,
      endpoint: "/v1/completions",
      completion_window: "24h",
    });
    for (;;) {
      const s = await c.batches.retrieve(second.id);
      if ((s.request_counts?.completed ?? 0) > 0) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    await cluster.kill(router, "SIGKILL");
    router = await cluster.router(["--routing", "round-robin", "--data-dir", dataDir]);
    await cluster.routerSees(router, 2);
    c = new OpenAI({ baseURL: router.base + "/v1", apiKey: "unused", maxRetries: 0 });
    const resumed = await finishedBatch(c, second.id);
    assertEquals(resumed.status, "completed");
    assertEquals(resumed.request_counts, { total: 24, completed: 24, failed: 0 });
    const longExpected = new Map(
      await Promise.all(PROMPTS.map(async (p) => [p, await greedyText(p, 120)] as const)),
    );
    const out = await (await c.files.content(resumed.output_file_id!)).text();
    const rows = out.split("\n").filter((l) => l !== "").map((l) => JSON.parse(l));
    assertEquals(rows.length, 24, "each line once");
    assertEquals(new Set(rows.map((r) => r.custom_id)).size, 24);
    for (const r of rows) {
      const i = Number(r.custom_id.slice("line-".length));
      assertEquals(r.response.body.choices[0].text, longExpected.get(PROMPTS[i % PROMPTS.length]!));
    }
  } finally {
    await Deno.remove(dataDir, { recursive: true });
  }
});
