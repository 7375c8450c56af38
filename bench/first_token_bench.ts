/**
 * Time to first token through the server, as a client sees it (streamed /v1/completions, token
 * id prompts, greedy): a long prompt cold, the same prompt again with a new last token (what
 * token-level prefix reuse saves), and a burst of prompts sent at once (what cutting a burst
 * into steps changes). Each round uses fresh prompts, so "cold" is cold.
 *
 *   deno run -A bench/first_token_bench.ts --model ../shared/models/compat/qwen2-like-q4_k_m.gguf
 *   deno run -A bench/first_token_bench.ts --url http://127.0.0.1:8000 --rounds 3
 */
import { parseArgs } from "@std/cli/parse-args";
import { httpGenerate, type RequestRecord } from "./load_clients.ts";
import { machineInfo, machineLine } from "./machine.ts";
import { fmt, summarize } from "./stats.ts";
import { seededRandom } from "./workload.ts";
import { startServer } from "../tests/harness/server_process.ts";

const HELP = `Usage: deno run -A bench/first_token_bench.ts (--model FILE | --url URL) [options]
  --model FILE          start this checkout's server on FILE (with --serve-args)
  --url URL             measure a running server instead
  --serve-args "..."    extra serve flags for the started server (default "--backend cpu")
  --long N              tokens of the long prompt (default 500)
  --burst N             prompts in the burst (default 32)
  --burst-tokens N      tokens of each burst prompt (default 16)
  --output N            tokens generated per request (default 8)
  --rounds N            rounds, fresh prompts each (default 3)
  --seed N              prompt seed (default 1000); a server keeps what it saw, so give each
                        run against the same server its own seed
  --vocab-from A --vocab-to B   token ids the prompts draw from (default 1000..20000)`;

export interface FirstTokenOptions {
  readonly long: number;
  readonly burst: number;
  readonly burstTokens: number;
  readonly output: number;
  readonly rounds: number;
  readonly idFrom: number;
  readonly idTo: number;
}

export function ids(rand: () => number, n: number, o: FirstTokenOptions): number[] {
  return Array.from({ length: n }, () => o.idFrom + Math.floor(rand() * (o.idTo - o.idFrom)));
}

export async function ttft(
  base: string,
  prompt: number[],
  o: FirstTokenOptions,
  i: number,
): Promise<number> {
  const r: RequestRecord = await httpGenerate(
    base,
    i,
    // Token ids, which /v1/completions takes as a prompt: the "new last token" is exactly one.
    { prompt: prompt as unknown as string, maxTokens: o.output },
    { temperature: 0, seed: 1 },
  );
  if (r.error || r.ttftMs === undefined) throw new Error(`request ${i} failed: ${r.error}`);
  return r.ttftMs;
}

/** One round: cold long prompt, the same with a new last token, then the burst. */
export async function round(base: string, o: FirstTokenOptions, seed: number) {
  const rand = seededRandom(seed);
  const long = ids(rand, o.long, o);
  const cold = await ttft(base, long, o, 0);
  const again = [...long.slice(0, -1), long.at(-1)! === o.idFrom ? o.idFrom + 1 : o.idFrom];
  const repeat = await ttft(base, again, o, 1);
  const prompts = Array.from({ length: o.burst }, () => ids(rand, o.burstTokens, o));
  const burst = await Promise.all(prompts.map((p, i) => ttft(base, p, o, 2 + i)));
  return { cold, repeat, burst };
}

if (import.meta.main) {
  const a = parseArgs(Deno.args, {
    string: ["model", "url", "serve-args"],
    boolean: ["help"],
    default: { long: 500, burst: 32, "burst-tokens": 16, output: 8, rounds: 3, seed: 1000 },
  });
  if (a.help || (!a.model && !a.url)) {
    console.log(HELP);
    Deno.exit(a.help ? 0 : 2);
  }
  const o: FirstTokenOptions = {
    long: Number(a.long),
    burst: Number(a.burst),
    burstTokens: Number(a["burst-tokens"]),
    output: Number(a.output),
    rounds: Number(a.rounds),
    idFrom: Number(a["vocab-from"] ?? 1000),
    idTo: Number(a["vocab-to"] ?? 20000),
  };
  const server = a.url ? undefined : await startServer({
    args: ["--model", a.model!, ...(a["serve-args"] ?? "--backend cpu").split(" ").filter(Boolean)],
    startTimeoutMs: 300_000,
  });
  const base = a.url ?? server!.base;
  try {
    // One short request first: load, compile and the first step's costs are not what we measure.
    await ttft(base, ids(seededRandom(Number(a.seed) - 1), 8, o), o, -1);
    const rows: string[] = [];
    for (let r = 0; r < o.rounds; r++) {
      const { cold, repeat, burst } = await round(base, o, Number(a.seed) + 7919 * r);
      const s = summarize(burst);
      rows.push(
        `| ${r + 1} | ${fmt(cold)} | ${fmt(repeat)} | ${fmt(Math.min(...burst))} | ${
          fmt(s.p50)
        } | ${fmt(s.p90)} | ${fmt(s.max)} |`,
      );
    }
    console.log(machineLine(machineInfo()));
    console.log(
      `${o.long}-token prompt cold, then again with a new last token; ${o.burst} prompts of ${o.burstTokens} tokens at once; ${o.output} tokens each; time to first token in ms (client side)\n`,
    );
    console.log(
      "| round | cold | new last token | burst first | burst p50 | burst p90 | burst last |",
    );
    console.log("|---:|---:|---:|---:|---:|---:|---:|");
    for (const row of rows) console.log(row);
  } finally {
    await server?.stop();
  }
}
