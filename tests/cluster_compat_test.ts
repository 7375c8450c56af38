/**
 * The router over replicas of every compat family (SentencePiece, Llama 3, Qwen2.5, Qwen3
 * vocabularies) on a stock nats-server (max_payload 1 MiB, under the 4–6 MiB info reply that
 * carries a real vocabulary): the router tokenizes with the vocabulary it got from the replica
 * and gives llama.cpp's greedy text.
 */
import { assertGreedyCompletion, clearPrompt, compatPath, readFixture } from "./harness/compat.ts";
import { Cluster } from "./_cluster.ts";

const FAMILIES = [
  "tinyllama-like-q4_0",
  "llama3-like-q4_k_m",
  "qwen2-like-q4_k_m",
  "qwen3-like-q4_k_m",
] as const;

for (const stem of FAMILIES) {
  Deno.test(`a router over a ${stem} replica on stock nats-server gives llama.cpp's greedy text`, async () => {
    const fx = await readFixture(stem);
    const { prompt, text, n } = await clearPrompt(fx, stem);
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
    await assertGreedyCompletion(router.base, stem, prompt, n, text);
  });
}
