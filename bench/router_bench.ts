/**
 * What a router costs: the same closed-loop workload sent to one replica directly and through
 * a router in front of it (nats-server with authentication, all on loopback, all in this run),
 * at concurrency 1 and 32, in A B B A order. Prints tokens/s with the ratio router/direct and
 * TTFT p50/p99 with what the router adds. With `--embeddings NxL`, the same for /v1/embeddings
 * requests of N inputs of L token ids each: texts/s and the router's CPU per input.
 *
 *   MODEL_MIRROR=../shared/models deno task bench:router [--requests 32] [--tokens 64]
 *     [--backend cpu] [--concurrency 1,32] [--embeddings 16x32]
 *
 * Needs `nats-server` on PATH or at $NATS_SERVER (Debian: apt-get install nats-server).
 */
import { parseArgs } from "@std/cli/parse-args";
import { httpGenerate, type RequestRecord } from "./load_clients.ts";
import { machineInfo, machineLine } from "./machine.ts";
import { metricValue, modelMirror, startServer } from "../tests/harness/server_process.ts";
import { fmt, ratio, summarize, table } from "./stats.ts";

const PROMPTS = [
  "Once upon a time",
  "The little dog",
  "Lily and Tom went to the park",
  "One day, a big red ball",
  "The sun was shining and",
  "Tim had a toy car",
];

async function freePort(): Promise<number> {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return await Promise.resolve(port);
}

async function waitFor(what: string, cond: () => Promise<boolean>, ms = 30_000): Promise<void> {
  const end = performance.now() + ms;
  while (!(await cond().catch(() => false))) {
    if (performance.now() > end) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Starts `main.ts router` and resolves with its base URL. */
async function startRouter(
  nats: string,
): Promise<{ base: string; pid: number; stop: () => Promise<void> }> {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("../main.ts", import.meta.url).pathname,
      "router",
      "--nats",
      nats,
      "--port",
      "0",
    ],
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let log = "";
  while (!/url\s+(http:\/\/\S+?)\//.test(log)) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`the router exited before listening:\n${log}`);
    log += value;
  }
  const base = /url\s+(http:\/\/\S+?)\//.exec(log)![1]!;
  (async () => {
    while (!(await reader.read()).done) { /* drain */ }
  })();
  return {
    base,
    pid: child.pid,
    stop: async () => {
      try {
        child.kill("SIGTERM");
      } catch { /* gone */ }
      await child.status;
    },
  };
}

/** CPU seconds (user + system) a process has used, from /proc/<pid>/stat (Linux). */
function cpuSeconds(pid: number): number {
  const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // utime and stime are fields 14 and 15 of the whole line, in clock ticks (100 per second).
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

interface Run {
  readonly records: RequestRecord[];
  readonly wallMs: number;
}

async function closedLoop(base: string, concurrency: number, requests: number, tokens: number) {
  const records: RequestRecord[] = [];
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    for (let i = next++; i < requests; i = next++) {
      records.push(
        await httpGenerate(base, i, { prompt: PROMPTS[i % PROMPTS.length]!, maxTokens: tokens }, {
          temperature: 0.8,
          seed: 1000 + i,
        }),
      );
    }
  }));
  return { records, wallMs: performance.now() - t0 };
}

/** Closed loop of /v1/embeddings requests, each of `inputs`: texts/s. */
async function embedLoop(
  base: string,
  concurrency: number,
  requests: number,
  inputs: number[][],
): Promise<number> {
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    for (let i = next++; i < requests; i = next++) {
      const r = await fetch(`${base}/v1/embeddings`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ input: inputs, encoding_format: "base64" }),
      });
      const body = await r.text();
      if (r.status !== 200) throw new Error(`/v1/embeddings answered ${r.status}: ${body}`);
    }
  }));
  return (requests * inputs.length) / ((performance.now() - t0) / 1000);
}

/** Direct and routed /v1/embeddings, A B B A at each concurrency: one table row each. */
async function embeddingRows(
  direct: string,
  routed: string,
  routerPid: number,
  levels: readonly number[],
  requests: number,
  shape: string,
): Promise<string[][]> {
  const m = /^(\d+)x(\d+)$/.exec(shape);
  if (!m) throw new Error(`--embeddings takes NxL (inputs x token ids), received ${shape}`);
  const [n, l] = [Number(m[1]), Number(m[2])];
  // Token ids inside stories260K's 512, the same every run.
  const inputs = Array.from(
    { length: n },
    (_, i) => Array.from({ length: l }, (_, j) => 1 + ((i * 31 + j * 7) % 500)),
  );
  await embedLoop(direct, 4, 8, inputs);
  await embedLoop(routed, 4, 8, inputs);
  const rows: string[][] = [];
  for (const c of levels) {
    const k = Math.max(requests, c * 2);
    const d1 = await embedLoop(direct, c, k, inputs);
    const cpu0 = cpuSeconds(routerPid);
    const r1 = await embedLoop(routed, c, k, inputs);
    const r2 = await embedLoop(routed, c, k, inputs);
    const routerCpu = cpuSeconds(routerPid) - cpu0;
    const d2 = await embedLoop(direct, c, k, inputs);
    const [d, r] = [(d1 + d2) / 2, (r1 + r2) / 2];
    rows.push([
      String(c),
      fmt(d, 0),
      fmt(r, 0),
      ratio(r, d),
      fmt((routerCpu * 1e6) / (2 * k * n), 0),
    ]);
  }
  return rows;
}

function tokensPerSecond(r: Run): number {
  return r.records.reduce((a, x) => a + x.outputTokens, 0) / (r.wallMs / 1000);
}

if (import.meta.main) {
  const args = parseArgs(Deno.args, {
    string: ["requests", "tokens", "backend", "concurrency", "embeddings"],
    default: { requests: "32", tokens: "64", backend: "cpu", concurrency: "1,32" },
  });
  const requests = Number(args.requests), tokens = Number(args.tokens);
  const levels = String(args.concurrency).split(",").map(Number);
  const models = modelMirror();
  const dir = await Deno.makeTempDir({ prefix: "llmserve_router_bench_" });
  const port = await freePort();
  await Deno.writeTextFile(
    `${dir}/nats.conf`,
    `listen: 127.0.0.1:${port}\nauthorization { user: bench, password: "bench-pass" }\n`,
  );
  const natsServer = new Deno.Command(Deno.env.get("NATS_SERVER") ?? "nats-server", {
    args: ["-c", `${dir}/nats.conf`],
    stdout: "null",
    stderr: "null",
  }).spawn();
  const nats = `nats://bench:bench-pass@127.0.0.1:${port}`;
  let replica: Awaited<ReturnType<typeof startServer>> | undefined;
  let router: Awaited<ReturnType<typeof startRouter>> | undefined;
  try {
    replica = await startServer({
      args: [
        "--model",
        `${models}/stories260K.bin`,
        "--tokenizer",
        `${models}/tok512.bin`,
        "--backend",
        args.backend,
        "--nats",
        nats,
      ],
    });
    router = await startRouter(nats);
    const routerBase = router.base;
    await waitFor("the router to see the replica", async () => {
      const text = await (await fetch(`${routerBase}/metrics`)).text();
      return metricValue(text, 'llm_router_replicas{state="ready"}') === 1;
    });
    // Warm both paths (JIT, connections) before measuring.
    for (let i = 0; i < 2; i++) {
      await closedLoop(replica.base, 4, 16, 16);
      await closedLoop(routerBase, 4, 16, 16);
    }
    const rows: string[][] = [];
    for (const c of levels) {
      const n = Math.max(requests, c * 2);
      // A B B A: drift of a shared machine (other processes, JIT) hits both paths alike.
      const d1 = await closedLoop(replica.base, c, n, tokens);
      const cpu0 = cpuSeconds(router.pid);
      const r1 = await closedLoop(routerBase, c, n, tokens);
      const r2 = await closedLoop(routerBase, c, n, tokens);
      const routerCpu = cpuSeconds(router.pid) - cpu0;
      const d2 = await closedLoop(replica.base, c, n, tokens);
      const join = (a: Run, b: Run): Run => ({
        records: [...a.records, ...b.records],
        wallMs: a.wallMs + b.wallMs,
      });
      const direct = join(d1, d2);
      const routed = join(r1, r2);
      for (const r of [...direct.records, ...routed.records]) {
        if (r.error) throw new Error(`request ${r.index} failed: ${r.error}`);
      }
      const d = summarize(direct.records.map((r) => r.ttftMs!));
      const t = summarize(routed.records.map((r) => r.ttftMs!));
      rows.push([
        String(c),
        fmt(tokensPerSecond(direct), 0),
        fmt(tokensPerSecond(routed), 0),
        ratio(tokensPerSecond(routed), tokensPerSecond(direct)),
        fmt(d.p50),
        fmt(t.p50),
        fmt(t.p50 - d.p50),
        fmt(d.p99),
        fmt(t.p99),
        fmt(t.p99 - d.p99),
        fmt(
          (routerCpu * 1e6) /
            [...r1.records, ...r2.records].reduce((a, x) => a + x.outputTokens, 0),
          0,
        ),
      ]);
    }
    console.log(machineLine(machineInfo()));
    console.log(
      `one ${args.backend} replica of stories260K, ${tokens} tokens per request, closed loop; ` +
        `router = the same replica behind main.ts router over nats-server on loopback\n`,
    );
    console.log(table([
      "concurrency",
      "direct tok/s",
      "router tok/s",
      "ratio",
      "direct TTFT p50 ms",
      "router TTFT p50 ms",
      "added p50 ms",
      "direct TTFT p99 ms",
      "router TTFT p99 ms",
      "added p99 ms",
      "router CPU µs/token",
    ], rows));
    if (args.embeddings !== undefined) {
      const shape = String(args.embeddings);
      const embedRows = await embeddingRows(
        replica.base,
        routerBase,
        router.pid,
        levels,
        requests,
        shape,
      );
      console.log(`\n/v1/embeddings, requests of ${shape.replace("x", " inputs x ")} token ids:\n`);
      console.log(table([
        "concurrency",
        "direct texts/s",
        "router texts/s",
        "ratio",
        "router CPU µs/input",
      ], embedRows));
    }
  } finally {
    await router?.stop();
    await replica?.stop();
    try {
      natsServer.kill("SIGKILL");
    } catch { /* gone */ }
    await natsServer.status;
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}
