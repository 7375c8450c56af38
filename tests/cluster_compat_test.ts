/**
 * The router over replicas of every compat family (SentencePiece, Llama 3, Qwen2.5, Qwen3
 * vocabularies) on a stock nats-server (max_payload 1 MiB, under the 4–6 MiB info reply that
 * carries a real vocabulary): the router tokenizes with the vocabulary it got from the replica
 * and gives llama.cpp's greedy text.
 */
import { assert, assertEquals } from "@std/assert";
import { compatPath, type Fixture, MARGIN, readFixture } from "./_compat.ts";
import { Cluster } from "./_cluster.ts";

const FAMILIES = [
  "tinyllama-like-q4_0",
  "llama3-like-q4_k_m",
  "qwen2-like-q4_k_m",
  "qwen3-like-q4_k_m",
] as const;

/** The prompt with the longest run of clear (margin > 0.5) steps, and llama.cpp's text. */
function clearPrompt(fx: Fixture): { prompt: string; text: string; n: number } {
  const scored = fx.prompts.map((p) => {
    const cut = p.steps.findIndex((s) => s.margin <= MARGIN);
    return { p, clear: cut < 0 ? p.steps.length : cut };
  }).sort((a, b) => b.clear - a.clear);
  const best = scored[0]!;
  assert(best.clear >= 1, `fixture ${fx.model.file}: no prompt has a clear first step`);
  const text = (best.p as unknown as { completion_text: string }).completion_text;
  return { prompt: best.p.prompt, text, n: Math.min(3, best.clear) };
}

for (const stem of FAMILIES) {
  Deno.test(`a router over a ${stem} replica on stock nats-server gives llama.cpp's greedy text`, async () => {
    const fx = await readFixture(stem);
    const { prompt, text, n } = clearPrompt(fx);
    await using cluster = await Cluster.start();
    await cluster.replicaServing([
      "--model",
      compatPath(stem),
      "--backend",
      "cpu",
      "--context-length",
      "256",
      "--kv-memory",
      "16MiB",
      "--max-running",
      "4",
    ]);
    const router = await cluster.router();
    await cluster.routerSees(router, 1, 30_000);
    const res = await fetch(`${router.base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt, max_tokens: n, temperature: 0 }),
    });
    const body = await res.json();
    assertEquals(res.status, 200, JSON.stringify(body));
    const got: string = body.choices[0].text;
    assert(got.length > 0, JSON.stringify(body));
    assert(text.startsWith(got), `${stem}: '${got}' is not a prefix of llama.cpp's '${text}'`);
  });
}
