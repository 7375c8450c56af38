/**
 * `--similar-cache-model`: the cache for similar questions embeds with another model than the
 * served one. Real servers as child processes: the oracle is the embedding model's own
 * /v1/embeddings on a server of it, whose two vectors' cosine (float64) must decide the hit:
 * a threshold just below it is a hit, just above it a miss, where the served model's own
 * cosine lies elsewhere.
 */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { startServer } from "./harness/server_process.ts";
import { compatPath } from "./harness/compat.ts";
import { modelFile } from "./harness/model_files.ts";

const Q1 = "Lily saw a big red ball in the park";
const Q2 = "Lily saw a big red ball in the garden";
const EMBEDDER = compatPath("qwen2-like-q4_k_m");
const SERVED = [
  ...["--model", modelFile("stories260K.bin"), "--tokenizer", modelFile("tok512.bin")],
  ...["--backend", "reference", "--kv-memory", "2MiB", "--log-format", "off"],
];

async function post(base: string, path: string, body: unknown) {
  const r = await fetch(`${base}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const j = await r.json();
  assertEquals(r.status, 200, JSON.stringify(j));
  return j;
}

/** Cosine of the two questions' vectors as a server's /v1/embeddings gives them, in float64. */
async function cosine(base: string): Promise<number> {
  const { data } = await post(base, "/v1/embeddings", { input: [Q1, Q2] });
  const [x, y] = [data[0].embedding as number[], data[1].embedding as number[]];
  let xy = 0, xx = 0, yy = 0;
  for (let i = 0; i < x.length; i++) (xy += x[i]! * y[i]!, xx += x[i]! ** 2, yy += y[i]! ** 2);
  return xy / Math.sqrt(xx * yy);
}

/** Q1 then Q2 as chat questions on a server whose cache embeds with EMBEDDER at `threshold`. */
async function askBoth(threshold: number) {
  const srv = await startServer({
    args: [
      ...SERVED,
      ...["--result-cache", "1MiB", "--similar-cache", String(threshold)],
      ...["--similar-cache-model", EMBEDDER],
    ],
  });
  try {
    const ask = (q: string) =>
      post(srv.base, "/v1/chat/completions", {
        messages: [{ role: "user", content: q }],
        max_tokens: 6,
        temperature: 0,
      });
    const first = await ask(Q1);
    return { first, second: await ask(Q2), log: srv.log() };
  } finally {
    await srv.stop();
  }
}

Deno.test("--similar-cache-model: a hit follows the embedding model's cosine, not the served model's", async () => {
  const embedding = await startServer({
    args: ["--model", EMBEDDER, "--backend", "cpu", "--kv-memory", "8MiB", "--log-format", "off"],
  });
  let score: number;
  try {
    score = await cosine(embedding.base);
  } finally {
    await embedding.stop();
  }
  const served = await startServer({ args: SERVED });
  let own: number;
  try {
    own = await cosine(served.base);
  } finally {
    await served.stop();
  }
  assert(score > 0 && score + 1e-4 < 1, `the embedding model's cosine is ${score}`);
  // Outside score ± 1e-3: with its own embeddings the server would miss below (own < score) or
  // hit above (own > score), so one of the two runs below tells the two models apart.
  assert(
    Math.abs(own - score) > 1e-3,
    `the served model's cosine ${own} must differ from the embedding model's ${score} for the test to tell them apart`,
  );

  const below = await askBoth(score - 1e-4);
  assertEquals(below.first.cached, false);
  assertEquals(below.second.cached, true);
  assertEquals(below.second.llmserve.cache.kind, "similar");
  assert(Math.abs(below.second.llmserve.cache.score - score) < 1e-4, JSON.stringify(below.second));
  assertEquals(below.second.choices[0].message.content, below.first.choices[0].message.content);
  assertStringIncludes(below.log, "questions embedded by");

  const above = await askBoth(score + 1e-4);
  assertEquals(above.second.cached, false);
  assertEquals(above.second.llmserve, undefined);
});

Deno.test("--similar-cache-model without --similar-cache is refused at start, naming both flags", async () => {
  const refused = await startServer({
    args: [...SERVED, "--result-cache", "1MiB", "--similar-cache-model", EMBEDDER],
  }).then(async (srv) => {
    await srv.stop();
    throw new Error("the server must not start");
  }, (e: Error) => e.message);
  assertStringIncludes(refused, "--similar-cache-model needs --similar-cache");
});
