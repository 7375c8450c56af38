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
import { httpGenerate, type RequestRecord } from "./load_clients.ts";
import { machineInfo, machineLine } from "./machine.ts";
import { fmt, ratio, summarize } from "./stats.ts";
import { seededRandom } from "./workload.ts";
import { type FirstTokenOptions, ids } from "./first_token_bench.ts";
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

/**
 * llama-server ends a stream with a 500 when the generated text so far does not parse as
 * UTF-8 content ("does not match the expected Content-only format": a random-weight model's
 * first token can be half a character). It fails while handling that token, so the error's
 * arrival is the first token's, and the tokens before it were computed. Counted and printed.
 */
const BROKEN_STREAMS = new Map<string, number>();

function firstEventMs(base: string, r: RequestRecord): number {
  if (r.ttftMs !== undefined) return r.ttftMs;
  if (String(r.error) === "500" && r.errorAtMs !== undefined) {
    BROKEN_STREAMS.set(base, (BROKEN_STREAMS.get(base) ?? 0) + 1);
    return r.errorAtMs;
  }
  throw new Error(`${base}: request ${r.index} failed: ${r.error}`);
}

/** Time to first token of one streamed greedy request for `prompt` (token ids). */
async function firstToken(base: string, prompt: number[], output: number, i: number) {
  const r = await httpGenerate(
    base,
    i,
    { prompt: prompt as unknown as string, maxTokens: output },
    {
      temperature: 0,
      seed: 1,
    },
  );
  return firstEventMs(base, r);
}

/**
 * Tokens/s of `clients` closed-loop clients, each until 2 of its requests (16 prompt tokens,
 * `output` tokens, EOS ignored) completed; a stream llama-server broke is asked again with a
 * new prompt, its tokens counted.
 */
async function throughput(base: string, clients: number, output: number, seed: number) {
  const rand = seededRandom(seed);
  const t0 = performance.now();
  const counts = await Promise.all(Array.from({ length: clients }, async (_, c) => {
    let tokens = 0;
    for (let done = 0, k = 0; done < 2; k++) {
      const r = await httpGenerate(
        base,
        c * 100 + k,
        { prompt: ids(rand, 16, O) as unknown as string, maxTokens: output },
        { temperature: 0, seed: 1, ignoreEos: true },
      );
      firstEventMs(base, r);
      tokens += r.outputTokens;
      if (!r.error) done++;
    }
    return tokens;
  }));
  return counts.reduce((a, b) => a + b, 0) / ((performance.now() - t0) / 1000);
}

/** Where the prompts' token ids come from (both vocabularies hold them). */
const O = { idFrom: 1000, idTo: 20000 } as FirstTokenOptions;

/** A long prompt cold, the same with a new last token, then a burst of 32 prompts at once. */
async function firstTokens(base: string, long: number, output: number, seed: number) {
  const rand = seededRandom(seed);
  const prompt = ids(rand, long, O);
  const cold = await firstToken(base, prompt, output, 0);
  const again = [...prompt.slice(0, -1), prompt.at(-1)! === O.idFrom ? O.idFrom + 1 : O.idFrom];
  const repeat = await firstToken(base, again, output, 1);
  const burst = await Promise.all(
    Array.from({ length: 32 }, (_, i) => firstToken(base, ids(rand, 16, O), output, 2 + i)),
  );
  return { cold, repeat, burst };
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
  const short = await firstToken(base, ids(seededRandom(seed + 1), 5, O), o.output, 0);
  const { cold, repeat, burst } = await firstTokens(base, o.long, o.output, seed + 2);
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
    for (const s of sides) await firstToken(s.base, ids(seededRandom(1), 8, O), 8, -1); // warm-up
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
  for (const s of sides) {
    console.log(`\n${s.name}: ${BROKEN_STREAMS.get(s.base) ?? 0} streams ended by a server error`);
  }
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
