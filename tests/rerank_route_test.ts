/**
 * POST /v1/rerank on qwen3-like (Qwen3's vocabulary, random weights) through the real app. The
 * oracle is the reference engine's own logits at the prompt's end, read directly (no logit bias,
 * no top logprobs): score = softmax over ["no", "yes"], which the route must reproduce, with the
 * prompt filled here by plain string replacement: Qwen3-Reranker's by default, the backend's,
 * the GGUF's `tokenizer.chat_template.rerank`, or `--rerank-prompt`.
 */
import { assert, assertAlmostEquals, assertEquals } from "@std/assert";
import { ServingCore } from "../actors/core.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { CoreBackend } from "../lib/backend/core_backend.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { createApp } from "../lib/http/app.ts";
import { DEFAULT_RERANK_INSTRUCTION, QWEN3_RERANK_PROMPT } from "../lib/core/rerank_prompt.ts";
import { RequestLog } from "../lib/http/request_log.ts";
import { serveService } from "../lib/http/serve.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { compatPath } from "./harness/compat.ts";
import { startServer } from "./harness/server_process.ts";
import { T, withMetadata } from "./_gguf_writer.ts";

const model = await loadModel(compatPath("qwen3-like-q4_k_m"));
const tokenizer = new Tokenizer(model.tokenizer!);
const KV = { numBlocks: 64, blockSize: 16 };

/** Qwen3-Reranker's prompt with its default instruction. */
const DEFAULT_PROMPT = QWEN3_RERANK_PROMPT.replace("{instruction}", DEFAULT_RERANK_INSTRUCTION);

/** The oracle: the reference engine's logits after the prompt, P(yes) against P(no). */
async function oracle(query: string, document: string, prompt = DEFAULT_PROMPT): Promise<number> {
  const text = prompt.replace("{query}", query).replace("{document}", document);
  const ids = tokenizer.encode(text, { special: true, bos: false });
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

const QUERY = "What is the capital of France?";
const DOCUMENTS = ["Paris is the capital of France.", "Bananas are yellow.", "France"];
/** Two prompts of other shapes than Qwen3-Reranker's (no instruction), as a file or a flag gives. */
const FILE_PROMPT =
  "<|im_start|>user\nQuery: {query}\nDocument: {document}\nRelevant?<|im_end|>\n" +
  "<|im_start|>assistant\n";
const FLAG_PROMPT =
  "Does the passage answer the question?\nQuestion: {query}\nPassage: {document}\n" +
  "Answer:";

/** The route's scores by document index. */
async function scores(base: string, body: Record<string, unknown> = {}) {
  const r = await fetch(`${base}/v1/rerank`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ query: QUERY, documents: DOCUMENTS, ...body }),
  });
  const j = await r.json();
  return { status: r.status, body: j };
}

async function assertScores(base: string, prompt: string) {
  const r = await scores(base);
  assertEquals(r.status, 200, JSON.stringify(r.body));
  const want = await Promise.all(DOCUMENTS.map((d) => oracle(QUERY, d, prompt)));
  for (const x of r.body.results) assertAlmostEquals(x.relevance_score, want[x.index]!, 1e-5);
  return want;
}

Deno.test("/v1/rerank asks in the GGUF's tokenizer.chat_template.rerank, and --rerank-prompt wins over it", async () => {
  const dir = await Deno.makeTempDir({ prefix: "rerank_prompt_" });
  const file = `${dir}/qwen3-like-reranker.gguf`;
  try {
    await Deno.writeFile(
      file,
      withMetadata(await Deno.readFile(compatPath("qwen3-like-q4_k_m")), [
        { key: "tokenizer.chat_template.rerank", type: T.STRING, value: FILE_PROMPT },
      ]),
    );
    assertEquals((await loadModel(file)).rerankPrompt, FILE_PROMPT);
    // The oracle's engine: the cpu engine's f16 KV cache moves a score near 0.5 by up to 1e-2.
    const flags = [
      "--model",
      file,
      "--backend",
      "reference",
      "--kv-memory",
      "8MiB",
      "--log-format",
      "off",
    ];
    const fromFile = await startServer({ args: flags });
    let own: number[];
    try {
      own = await assertScores(fromFile.base, FILE_PROMPT);
      // The file's prompt has no {instruction} place: an instruction is refused, not ignored.
      const r = await scores(fromFile.base, { instruction: "Judge strictly" });
      assertEquals([r.status, r.body.error.param], [400, "instruction"]);
    } finally {
      await fromFile.stop();
    }
    const fromFlag = await startServer({ args: [...flags, "--rerank-prompt", FLAG_PROMPT] });
    try {
      const flagged = await assertScores(fromFlag.base, FLAG_PROMPT);
      assert(
        flagged.some((x, i) => Math.abs(x - own[i]!) > 1e-4),
        "the two prompts must score differently for the test to tell them apart",
      );
    } finally {
      await fromFlag.stop();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("--rerank-prompt without a {document} place is refused at start, naming the flag", async () => {
  const refused = await startServer({
    args: [
      "--model",
      compatPath("qwen3-like-q4_k_m"),
      "--backend",
      "cpu",
      "--rerank-prompt",
      "Q: {query}",
    ],
  }).then(async (srv) => {
    await srv.stop();
    throw new Error("the server must not start");
  }, (e: Error) => e.message);
  assert(refused.includes("--rerank-prompt: must have {query} and {document} places"), refused);
});
