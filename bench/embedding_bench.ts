/**
 * Embedding throughput through the server beside llama-server --embeddings on the same file:
 * texts/s for requests of N inputs of L tokens each (token-id inputs, so both sides compute
 * exactly L rows an input), the two servers asked in turn (A B A B ...) so load on the machine
 * hits both alike. Mean pooling on both.
 *
 *   deno run -A bench/embedding_bench.ts --model /tmp/perf/qwen25-05b-gemm-q4_k_m.gguf \
 *     --llama-cpp /tmp/llama.cpp/build/bin
 */
import { parseArgs } from "@std/cli/parse-args";
import { machineInfo, machineLine } from "./machine.ts";
import { fmt, summarize } from "./stats.ts";
import { seededRandom } from "./workload.ts";
import { startServer } from "../tests/harness/server_process.ts";
import { type Side, startLlamaServer } from "./llama_server.ts";

const HELP = `Usage: deno run -A bench/embedding_bench.ts --model FILE [options]
  --model FILE        the GGUF both servers load
  --llama-cpp DIR     llama.cpp's bin folder (llama-server); without it, ours alone
  --cells "N×L,..."   requests of N inputs of L tokens (default "1x32,16x32,256x32,1x512,16x512")
  --rounds N          times each cell is asked of each server (default 3)
  --threads N         threads of both (default 2)
  --serve-args "..."  extra flags for our server (default "--backend cpu")`;

async function ours(model: string, args: string): Promise<Side> {
  const s = await startServer({
    args: ["--model", model, ...args.split(" ").filter(Boolean), "--log-format", "off"],
    startTimeoutMs: 300_000,
  });
  return { name: "llmserve", base: s.base, stop: async () => void await s.stop() };
}

function llamaServer(bin: string, model: string, threads: number): Promise<Side> {
  return startLlamaServer(bin, model, [
    ...["--embeddings", "--pooling", "mean", "-t", String(threads)],
    ...["-c", "16384", "-np", "16", "-b", "2048", "-ub", "512"],
  ]);
}

/** One request of `inputs`; returns its wall time in ms. */
async function embed(base: string, inputs: number[][]): Promise<number> {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/embeddings`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ input: inputs, encoding_format: "float" }),
  });
  const j = await r.json();
  if (!r.ok || j.data?.length !== inputs.length) {
    throw new Error(`${base}: ${r.status} ${JSON.stringify(j).slice(0, 300)}`);
  }
  return performance.now() - t0;
}

if (import.meta.main) {
  const a = parseArgs(Deno.args, {
    string: ["model", "llama-cpp", "cells", "serve-args"],
    boolean: ["help"],
    default: { rounds: 3, threads: 2, cells: "1x32,16x32,256x32,1x512,16x512" },
  });
  if (a.help || !a.model) {
    console.log(HELP);
    Deno.exit(a.help ? 0 : 2);
  }
  const threads = Number(a.threads);
  const cells = String(a.cells).split(",").map((c: string) =>
    c.split(/[x×]/).map(Number) as [number, number]
  );
  const sides = [await ours(a.model, a["serve-args"] ?? `--backend cpu --threads ${threads}`)];
  if (a["llama-cpp"]) sides.push(await llamaServer(a["llama-cpp"], a.model, threads));
  try {
    const rand = seededRandom(7);
    const ids = (n: number) => Array.from({ length: n }, () => 1000 + Math.floor(rand() * 19000));
    // Warm-up: load, compile and first-step costs are not what is measured.
    for (const s of sides) await embed(s.base, [ids(8)]);
    const rows: string[] = [];
    for (const [n, len] of cells) {
      const times = sides.map(() => [] as number[]);
      for (let r = 0; r < Number(a.rounds); r++) {
        const inputs = Array.from({ length: n }, () => ids(len));
        for (const [i, s] of sides.entries()) times[i]!.push(await embed(s.base, inputs));
      }
      const rate = times.map((t) => n / (summarize(t).p50 / 1000));
      rows.push(
        `| ${n} × ${len} | ${rate.map((x) => fmt(x, 2)).join(" | ")} |${
          rate.length > 1 ? ` ${fmt(rate[0]! / rate[1]!, 2)}× |` : ""
        }`,
      );
    }
    console.log(machineLine(machineInfo()));
    console.log(`\nmean pooling, ${threads} threads, median of ${a.rounds} rounds, texts/s\n`);
    const names = sides.map((s) => s.name);
    console.log(`| inputs × tokens | ${names.join(" | ")} |${names.length > 1 ? " ratio |" : ""}`);
    console.log(`|---|${names.map(() => "---:|").join("")}${names.length > 1 ? "---:|" : ""}`);
    for (const row of rows) console.log(row);
  } finally {
    for (const s of sides) await s.stop();
  }
}
