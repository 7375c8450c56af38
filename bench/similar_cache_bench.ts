/**
 * The cache for similar questions on a replayed question set: 200 questions, each with 2
 * paraphrases (hits wanted), and 200 near-misses that differ from a question in what it asks
 * about (hits there are false hits); plus what the question's embedding adds to a miss. The
 * set is made from templates (20 actions × 10 things), so it is reproducible and large enough;
 * the server is the real app in this process on the `cpu` engine.
 *
 *   deno run -A bench/similar_cache_bench.ts --model ../shared/models/compat/qwen3-like-q4_k_m.gguf
 *   deno run -A bench/similar_cache_bench.ts --model ../shared/models/stories260K.bin \
 *     --tokenizer ../shared/models/tok512.bin
 */
import { parseArgs } from "@std/cli/parse-args";
import { ServingCore } from "../actors/core.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { CachedBackend } from "../lib/backend/cached_backend.ts";
import { CoreBackend, embeddingSettings } from "../lib/backend/core_backend.ts";
import { createApp } from "../lib/http/app.ts";
import { RequestLog } from "../lib/http/request_log.ts";
import { serveService } from "../lib/http/serve.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { machineInfo, machineLine } from "./machine.ts";
import { fmt, summarize } from "./stats.ts";
import { seededRandom } from "./workload.ts";

const ACTIONS = [
  "reset",
  "change",
  "update",
  "delete",
  "recover",
  "share",
  "back up",
  "sync",
  "export",
  "import",
  "verify",
  "lock",
  "unlock",
  "rename",
  "move",
  "copy",
  "print",
  "restore",
  "hide",
  "archive",
];
const THINGS = [
  "password",
  "email address",
  "profile picture",
  "account",
  "phone number",
  "billing plan",
  "username",
  "notification settings",
  "calendar",
  "contacts",
];

/** Each question, its two paraphrases, and its near-miss (the same action on another thing). */
export function questionSet() {
  return ACTIONS.flatMap((a) =>
    THINGS.map((t, i) => ({
      question: `How do I ${a} my ${t}?`,
      paraphrases: [`What is the way to ${a} my ${t}?`, `Can you explain how I can ${a} my ${t}?`],
      nearMiss: `How do I ${a} my ${THINGS[(i + 1) % THINGS.length]}?`,
    }))
  );
}

async function serve(modelPath: string, tokenizerPath: string | undefined, threshold: number) {
  const model = await loadModel(modelPath, tokenizerPath ? { tokenizerPath } : {});
  const tokenizer = new Tokenizer(model.tokenizer!);
  const kv = { numBlocks: 256, blockSize: 16 };
  const make = () => WasmEngine.create(model.config, model.weights, kv, { threads: 2 });
  const core = new ServingCore({ engine: await make(), engineFactory: make, codec: tokenizer });
  const inner = new CoreBackend(
    "m",
    core,
    tokenizer,
    undefined,
    undefined,
    embeddingSettings(model),
  );
  const backend = new CachedBackend(inner, 64 << 20, { threshold, capacityBytes: 64 << 20 });
  const service = createApp({ backend, requestLog: new RequestLog("text", () => {}) });
  const server = await serveService(service, {
    hostname: "127.0.0.1",
    port: 0,
    drainTimeoutMs: 1000,
    signals: [],
  });
  const base = `http://127.0.0.1:${server.addr.port}`;
  const ask = async (q: string, cache = true) => {
    const t0 = performance.now();
    const r = await fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        messages: [{ role: "user", content: q }],
        max_tokens: 4,
        temperature: 0,
        ...(cache ? {} : { cache: false }),
      }),
    });
    const j = await r.json();
    if (!r.ok) throw new Error(JSON.stringify(j));
    return { ms: performance.now() - t0, similar: j.llmserve?.cache?.kind === "similar" };
  };
  return {
    ask,
    async close() {
      service.close();
      await server.stop();
      await core.close();
    },
  };
}

if (import.meta.main) {
  const a = parseArgs(Deno.args, {
    string: ["model", "tokenizer", "thresholds"],
    default: { thresholds: "0.95,0.9" },
  });
  if (!a.model) {
    console.log("Usage: deno run -A bench/similar_cache_bench.ts --model FILE [--tokenizer FILE]");
    Deno.exit(2);
  }
  const set = questionSet();
  const rows: string[] = [];
  for (const threshold of a.thresholds.split(",").map(Number)) {
    const s = await serve(a.model, a.tokenizer, threshold);
    try {
      await s.ask("Warm up"); // compile and first-step costs are not measured
      // A miss with the cache on (its question is embedded) against the same kind of miss
      // with cache: false (no embedding), alternating, on questions not asked before.
      // Each pair asks the same fresh text twice, off first (cache: false stores nothing); an
      // "on" ask that a similar earlier one answered is not a miss, and is left out.
      const on: number[] = [], off: number[] = [];
      const random = seededRandom(threshold * 1000);
      const word = () =>
        Array.from({ length: 6 }, () => "abcdefghij"[Math.floor(random() * 10)]).join("");
      for (let i = 0; i < 20; i++) {
        const q = `${word()} ${word()} ${word()}?`;
        const cold = await s.ask(q, false);
        const warm = await s.ask(q);
        if (!warm.similar) (off.push(cold.ms), on.push(warm.ms));
      }
      for (const q of set) await s.ask(q.question);
      let hits = 0, falseHits = 0;
      for (const q of set) for (const p of q.paraphrases) if ((await s.ask(p)).similar) hits++;
      for (const q of set) if ((await s.ask(q.nearMiss)).similar) falseHits++;
      const added = summarize(on).p50 - summarize(off).p50;
      rows.push(
        `| ${threshold} | ${fmt((100 * hits) / (2 * set.length))}% | ${
          fmt((100 * falseHits) / set.length)
        }% | ${fmt(summarize(off).p50)} | ${fmt(added)} |`,
      );
    } finally {
      await s.close();
    }
  }
  console.log(machineLine(machineInfo()));
  console.log(
    `\n${a.model.split("/").at(-1)}: ${set.length} questions, ${
      2 * set.length
    } paraphrases, ${set.length} near-misses; 4 tokens an answer\n`,
  );
  console.log(
    "| threshold | paraphrase hit rate | near-miss false-hit rate | miss ms (cache off) | added to a miss, ms |",
  );
  console.log("|---:|---:|---:|---:|---:|");
  for (const r of rows) console.log(r);
}
