/**
 * A router and replicas over a real nats-server with stock limits (max_payload 1 MiB), under
 * inputs chosen to break them: requests too large for the bus, hostile peers on the request
 * and heartbeat subjects. The expected text comes from the CPU reference engine in this process
 * (one sequence alone, no scheduler, no NATS).
 */
import { assert, assertEquals, assertMatch } from "@std/assert";
import { loadModel } from "../lib/model/load_model.ts";
import { CpuEngine } from "../lib/engine/cpu/cpu_engine.ts";
import { referenceGenerate } from "../lib/engine/cpu/reference_generate.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { modelFile } from "./_model_files.ts";
import { metricValue, scrape } from "./_http_harness.ts";
import { Cluster } from "./_cluster.ts";

const model = await loadModel(modelFile("stories260K.bin"), {
  tokenizerPath: modelFile("tok512.bin"),
});
const tokenizer = new Tokenizer(model.tokenizer!);
const KV = ["--kv-memory", "8MiB", "--max-batch-tokens", "128"];
const MIB = 1 << 20;

/** Greedy text of one sequence alone on the CPU engine (stops at EOS or BOS, as the server). */
async function greedyText(prompt: string, maxTokens: number): Promise<string> {
  const ids = tokenizer.encode(prompt, { bos: true });
  const engine = new CpuEngine(model.config, model.weights, { numBlocks: 64, blockSize: 16 });
  const stops = [tokenizer.eosId, tokenizer.bosId];
  const { tokens } = await referenceGenerate(engine, ids, maxTokens, GREEDY, {
    stopTokens: stops,
  });
  const out = stops.includes(tokens.at(-1)!) ? tokens.slice(0, -1) : tokens;
  const dec = tokenizer.createDecoder({ afterBos: true });
  return out.map((t) => dec.push(t)).join("") + dec.flush();
}

async function complete(base: string, body: string) {
  const res = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });
  return { status: res.status, body: await res.json() };
}

/** A request body just under the HTTP limit (1 MiB), nearly all of it stop strings. */
function bigStopBody(prompt: string): string {
  const head = JSON.stringify({ prompt, max_tokens: 5, temperature: 0, stop: [] }).length;
  const per = Math.floor((MIB - 64 - head) / 16) - 3;
  const stop = Array.from({ length: 16 }, (_, i) => String.fromCharCode(65 + i).repeat(per));
  const body = JSON.stringify({ prompt, max_tokens: 5, temperature: 0, stop });
  assert(body.length < MIB, `body is ${body.length} bytes`);
  return body;
}

Deno.test("a request too large for the bus is refused with 413 and leaks no replica slot", async () => {
  await using cluster = await Cluster.start();
  const replica = await cluster.replica([...KV, "--max-running", "1", "--max-waiting", "1"]);
  const router = await cluster.router();
  await cluster.routerSees(router, 1);
  const prompt = "Once upon a time";
  // The replica itself takes it: only the hop over NATS is too large.
  const direct = await complete(replica.base, bigStopBody(prompt));
  assertEquals(direct.status, 200, JSON.stringify(direct.body).slice(0, 300));
  // More than max-running + max-waiting of them: a leaked slot each would leave none.
  for (let i = 0; i < 4; i++) {
    const r = await complete(router.base, bigStopBody(prompt));
    assertEquals(r.status, 413, JSON.stringify(r.body).slice(0, 300));
    assertEquals(r.body.error.code, "payload_too_large");
    assertMatch(r.body.error.message, /over the NATS server's max_payload of 1048576 bytes/);
  }
  const ok = await complete(
    router.base,
    JSON.stringify({ prompt, max_tokens: 20, temperature: 0 }),
  );
  assertEquals(ok.status, 200, JSON.stringify(ok.body));
  assertEquals(ok.body.choices[0].text, await greedyText(prompt, 20));
  assertEquals(await fetch(`${router.base}/ready`).then((r) => r.status), 200);
  assertEquals(metricValue(await scrape(replica.base), "llm_requests_running"), 0);
});
