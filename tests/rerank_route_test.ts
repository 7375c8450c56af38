/**
 * POST /v1/rerank on qwen3-like (Qwen3's vocabulary, random weights) through the real app. The
 * oracle is the reference engine's own logits at the prompt's end, read directly (no logit bias,
 * no top logprobs): score = softmax over ["no", "yes"], which the route must reproduce.
 */
import { assert, assertAlmostEquals, assertEquals } from "@std/assert";
import { ServingCore } from "../actors/core.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { CoreBackend } from "../lib/backend/core_backend.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { createApp } from "../lib/http/app.ts";
import { DEFAULT_RERANK_INSTRUCTION, QWEN3_RERANK_PROMPT } from "../lib/http/rerank_route.ts";
import { RequestLog } from "../lib/http/request_log.ts";
import { serveService } from "../lib/http/serve.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { compatPath } from "./harness/compat.ts";

const model = await loadModel(compatPath("qwen3-like-q4_k_m"));
const tokenizer = new Tokenizer(model.tokenizer!);
const KV = { numBlocks: 64, blockSize: 16 };

/** The oracle: the reference engine's logits after the prompt, P(yes) against P(no). */
async function oracle(query: string, document: string): Promise<number> {
  const text = QWEN3_RERANK_PROMPT.replace("{instruction}", DEFAULT_RERANK_INSTRUCTION)
    .replace("{query}", query).replace("{document}", document);
  const ids = tokenizer.encode(text, { special: true });
  const engine = new CpuEngine(model.config, model.weights, KV);
  try {
    const r = await engine.step({
      stepId: 0,
      returnLogits: true,
      seqs: [{
        seqId: 1,
        tokens: ids,
        startPos: 0,
        blockTable: Array.from({ length: Math.ceil(ids.length / 16) }, (_, i) => i),
        sample: true,
        sampling: GREEDY,
      }],
    });
    const logits = r.sampled[0]!.logits!;
    const [yes, no] = ["yes", "no"].map((w) => tokenizer.encode(w, { bos: false })[0]!);
    const [y, n] = [logits[yes!]!, logits[no!]!];
    return 1 / (1 + Math.exp(n - y));
  } finally {
    engine.dispose();
  }
}

Deno.test("/v1/rerank scores each document as P(yes) against P(no) from the model's logits, best first, top_n of them", async () => {
  const make = () => new CpuEngine(model.config, model.weights, KV);
  const core = new ServingCore({ engine: make(), engineFactory: make, codec: tokenizer });
  const backend = new CoreBackend("qwen3-like", core, tokenizer);
  const service = createApp({ backend, requestLog: new RequestLog("text", () => {}) });
  const server = await serveService(service, {
    hostname: "127.0.0.1",
    port: 0,
    drainTimeoutMs: 1000,
    signals: [],
  });
  const post = (body: unknown) =>
    fetch(`http://127.0.0.1:${server.addr.port}/v1/rerank`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
  try {
    const query = "What is the capital of France?";
    const documents = ["Paris is the capital of France.", "Bananas are yellow.", "France"];
    const r = await post({ query, documents, top_n: 2, return_documents: true });
    const j = await r.json();
    assertEquals(r.status, 200, JSON.stringify(j));
    const want = await Promise.all(documents.map((d) => oracle(query, d)));
    const order = [0, 1, 2].sort((a, b) => want[b]! - want[a]!);
    assertEquals(j.results.map((x: { index: number }) => x.index), order.slice(0, 2));
    for (const x of j.results) {
      assertAlmostEquals(x.relevance_score, want[x.index]!, 1e-5);
      assertEquals(x.document.text, documents[x.index]);
    }
    assert(j.usage.prompt_tokens > 0);
    // Client text may not spell a special token of the prompt.
    const bad = await post({ query, documents: ["ok", "x<|im_end|>y"] });
    const e = await bad.json();
    assertEquals([bad.status, e.error.param], [400, "documents[1]"]);
    const empty = await post({ query, documents: [] });
    assertEquals(empty.status, 400);
    await empty.body?.cancel();
  } finally {
    service.close();
    await server.stop();
    await core.close();
  }
});
