/**
 * Memory across engine restarts: a server with N injected engine faults, driven by
 * generations until every fault has fired, its RSS read before the first and after the last.
 * Prints a table with the growth per restart.
 *
 *   MODEL_MIRROR=../shared/models deno run -A bench/restart_memory.ts [--faults 30] [--backend cpu]
 */
import { parseArgs } from "@std/cli/parse-args";
import { metricValue, startServer } from "../tests/harness/server_process.ts";
import { markdownTable } from "./markdown_table.ts";

const args = parseArgs(Deno.args, { string: ["faults", "backend", "kv-memory", "model"] });
const faults = Number(args.faults ?? 30);
const backend = args.backend ?? "cpu";
const mirror = Deno.env.get("MODEL_MIRROR") ?? "../shared/models";
const every = 12;
const steps = Array.from({ length: faults }, (_, i) => (i + 1) * every);

async function run(withFaults: boolean) {
  const server = await startServer({
    args: [
      "--model",
      args.model ?? `${mirror}/stories260K-ctx512.gguf`,
      "--backend",
      backend,
      "--kv-memory",
      args["kv-memory"] ?? "16MiB",
      "--log-format",
      "off",
    ],
    env: withFaults ? { LLMSERVE_FAULT_STEPS: steps.join(",") } : {},
    startTimeoutMs: 120_000,
  });
  try {
    const gen = () =>
      fetch(`${server.base}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "Once upon a time", max_tokens: 64, temperature: 0 }),
      }).then((r) => r.json());
    await gen();
    const before = server.rssBytes()!;
    let peak = before;
    const target = faults * every + every;
    for (let i = 0; i < 400; i++) {
      await Promise.all([gen(), gen(), gen(), gen()]);
      peak = Math.max(peak, server.rssBytes()!);
      const m = await (await fetch(`${server.base}/metrics`)).text();
      if ((metricValue(m, "llm_steps_total") ?? 0) >= target) break;
    }
    const m = await (await fetch(`${server.base}/metrics`)).text();
    const restarts = metricValue(m, "llm_executor_restarts_total") ?? 0;
    const after = server.rssBytes()!;
    return { before, after, peak, restarts };
  } finally {
    await server.stop("SIGTERM");
  }
}

const mib = (b: number) => (b / 2 ** 20).toFixed(0);
const base = await run(false);
const hurt = await run(true);
console.log(markdownTable(
  [
    "run",
    "restarts",
    "RSS before (MiB)",
    "RSS after (MiB)",
    "peak (MiB)",
    "growth per restart (MiB)",
  ],
  [base, hurt].map((r, i) => [
    i === 0 ? "no faults (same load)" : `${faults} injected faults`,
    String(r.restarts),
    mib(r.before),
    mib(r.after),
    mib(r.peak),
    r.restarts > 0 ? ((r.after - r.before) / r.restarts / 2 ** 20).toFixed(2) : "-",
  ]),
));
