/**
 * Through the server, beside llama-server on the same file and the same HTTP client: decode
 * tokens/s at 1, 8 and 32 clients, and time to first token for a 5-token prompt, a long
 * prompt cold, the same prompt again with a new last token, and a burst of 32 prompts. The two
 * servers are asked in turn, round by round (A B A B ...), so load on the machine hits both
 * alike; each cell is the median of the rounds. Both run on the CPU with the same threads.
 *
 *   deno run -A bench/server_vs_llama_server.ts --model /tmp/perf/qwen25-05b-q4_k_m.gguf \
 *     --llama-cpp /tmp/llama.cpp/build/bin
 */
import { parseArgs } from "@std/cli/parse-args";
import { httpGenerate } from "./load_clients.ts";
import { machineInfo, machineLine } from "./machine.ts";
import { fmt, ratio, summarize } from "./stats.ts";
import { seededRandom } from "./workload.ts";
import { type FirstTokenOptions, ids, round, ttft } from "./first_token_bench.ts";
import { type Side, startLlamaServer } from "./llama_server.ts";
import { startServer } from "../tests/harness/server_process.ts";

const HELP =
  `Usage: deno run -A bench/server_vs_llama_server.ts --model FILE --llama-cpp DIR [options]
  --model FILE        the GGUF both servers load
  --llama-cpp DIR     llama.cpp's bin folder (llama-server)
  --clients LIST      closed-loop client counts for tokens/s (default 1,8,32)
  --output N          tokens each throughput request generates, EOS ignored (default 64)
  --long N            tokens of the long prompt (default 500)
  --rounds N          rounds a side (default 3)
  --threads N         threads of both (default 2)
  --seed N            prompt seed (default 4200)
  --serve-args "..."  extra flags for our server`;

/** Tokens/s of `clients` closed-loop clients, each sending 2 requests of 16 prompt tokens. */
async function throughput(base: string, clients: number, output: number, seed: number) {
  const o: FirstTokenOptions = {
    long: 0,
    burst: 0,
    burstTokens: 0,
    output,
    rounds: 1,
    idFrom: 1000,
    idTo: 20000,
  };
  const rand = seededRandom(seed);
  const t0 = performance.now();
  const counts = await Promise.all(Array.from({ length: clients }, async (_, c) => {
    let tokens = 0;
    for (let k = 0; k < 2; k++) {
      const r = await httpGenerate(
        base,
        c * 2 + k,
        { prompt: ids(rand, 16, o) as unknown as string, maxTokens: output },
        { temperature: 0, seed: 1, ignoreEos: true },
      );
      if (r.error) throw new Error(`${base}: request failed: ${r.error}`);
      tokens += r.outputTokens;
    }
    return tokens;
  }));
  return counts.reduce((a, b) => a + b, 0) / ((performance.now() - t0) / 1000);
}

interface Round {
  readonly tps: number[];
  readonly short: number;
  readonly cold: number;
  readonly repeat: number;
  readonly burstP50: number;
  readonly burstLast: number;
}

async function measure(
  base: string,
  clients: number[],
  decodeTokens: number,
  o: FirstTokenOptions,
  seed: number,
) {
  const tps: number[] = [];
  for (const c of clients) tps.push(await throughput(base, c, decodeTokens, seed + c));
  const short = await ttft(base, ids(seededRandom(seed + 1), 5, o), o, 0);
  const { cold, repeat, burst } = await round(base, o, seed + 2);
  const s = summarize(burst);
  return { tps, short, cold, repeat, burstP50: s.p50, burstLast: s.max } satisfies Round;
}

function median(values: number[]): number {
  return summarize(values).p50;
}

async function ours(model: string, threads: number, extra: string): Promise<Side> {
  const s = await startServer({
    args: [
      ...["--model", model, "--backend", "cpu", "--threads", String(threads)],
      ...["--max-running", "32", "--log-format", "off"],
      ...extra.split(" ").filter(Boolean),
    ],
    startTimeoutMs: 600_000,
  });
  return { name: "llmserve", base: s.base, stop: async () => void await s.stop() };
}

if (import.meta.main) {
  const a = parseArgs(Deno.args, {
    string: ["model", "llama-cpp", "clients", "serve-args"],
    boolean: ["help"],
    default: { clients: "1,8,32", output: 64, long: 500, rounds: 3, threads: 2, seed: 4200 },
  });
  if (a.help || !a.model || !a["llama-cpp"]) {
    console.log(HELP);
    Deno.exit(a.help ? 0 : 2);
  }
  const clients = a.clients.split(",").map(Number);
  const threads = Number(a.threads);
  const decodeTokens = Number(a.output);
  const o: FirstTokenOptions = {
    long: Number(a.long),
    burst: 32,
    burstTokens: 16,
    output: 8,
    rounds: 1,
    idFrom: 1000,
    idTo: 20000,
  };
  // 32 slots, each able to hold the long prompt and what follows it.
  const slotCtx = Math.max(1024, o.long + 128);
  const sides = [
    await ours(a.model, threads, a["serve-args"] ?? ""),
    await startLlamaServer(a["llama-cpp"], a.model, [
      ...["-t", String(threads), "-np", "32", "-c", String(32 * slotCtx)],
    ]),
  ];
  const results = new Map<string, Round[]>(sides.map((s) => [s.name, []]));
  try {
    for (const s of sides) await ttft(s.base, ids(seededRandom(1), 8, o), o, -1); // warm-up
    for (let r = 0; r < Number(a.rounds); r++) {
      for (const s of r % 2 ? [...sides].reverse() : sides) {
        results.get(s.name)!.push(
          await measure(s.base, clients, decodeTokens, o, Number(a.seed) + 7919 * r),
        );
      }
    }
  } finally {
    for (const s of sides) await s.stop();
  }
  printTables(results, clients, decodeTokens, o, a.model);
}

function printTables(
  results: Map<string, Round[]>,
  clients: number[],
  decodeTokens: number,
  o: FirstTokenOptions,
  model: string,
) {
  const [us, them] = [results.get("llmserve")!, results.get("llama-server")!];
  console.log(machineLine(machineInfo()));
  console.log(`${model}; medians of ${us.length} rounds a side, alternating\n`);
  console.log(
    `Decode tokens/s (${decodeTokens} tokens a request, EOS ignored, 2 requests a client)\n`,
  );
  console.log("| clients | llmserve | llama-server | ratio |");
  console.log("|---:|---:|---:|---:|");
  clients.forEach((c, i) => {
    const [x, y] = [median(us.map((r) => r.tps[i]!)), median(them.map((r) => r.tps[i]!))];
    console.log(`| ${c} | ${fmt(x)} | ${fmt(y)} | ${ratio(x, y)} |`);
  });
  console.log(`\nTime to first token, ms (${o.output} tokens a request)\n`);
  console.log("| prompt | llmserve | llama-server | ours / theirs |");
  console.log("|---|---:|---:|---:|");
  const rows: [string, keyof Round][] = [
    ["5 tokens", "short"],
    [`${o.long} tokens, cold`, "cold"],
    [`the same, new last token`, "repeat"],
    [`burst of 32 × 16 tokens, median`, "burstP50"],
    [`burst of 32 × 16 tokens, last`, "burstLast"],
  ];
  for (const [label, key] of rows) {
    const x = median(us.map((r) => r[key] as number));
    const y = median(them.map((r) => r[key] as number));
    console.log(`| ${label} | ${fmt(x)} | ${fmt(y)} | ${ratio(x, y)} |`);
  }
}
