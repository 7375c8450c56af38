import { resolve } from "node:path";
/**
 * Our engine against node-llama-cpp (prebuilt llama.cpp for Node) on the same GGUF: one
 * sequence and N parallel sequences of a fixed number of tokens, tokens/s side by side in the
 * same run. node-llama-cpp is installed into a directory of its own with npm (it is not a
 * dependency of the project) and run with `node`; when any of that fails, the reason is
 * reported and our side is still measured.
 */
import type { BackendChoice } from "../lib/compose/engine_factory.ts";
import { DEFAULT_LIMITS } from "../lib/engine/limits.ts";
import { type BenchModel, makeCore, timedGeneration } from "./compare_common.ts";
import { fmt, ratio, table } from "./stats.ts";

export const NODE_LLAMA_CPP = "node-llama-cpp@3.21.1";

export interface LlamaCppOptions {
  readonly parallel: readonly number[];
  readonly tokens: number;
  readonly prompt: string;
  readonly temperature: number;
  /** Rounds of measurements, alternating between the sides; the median is reported. */
  readonly repeats: number;
  /** CPU threads llama.cpp may use. */
  readonly threads: number;
  /** Our backends to measure (one that cannot be created is reported). */
  readonly backends: readonly BackendChoice[];
  /** Where node-llama-cpp is (or gets) installed; default a fresh temp dir, removed after. */
  readonly prefix?: string;
  /** Skip node-llama-cpp entirely (smoke tests). */
  readonly skipLlamaCpp?: boolean;
  readonly log: (line: string) => void;
}

export interface ThroughputRow {
  readonly engine: string;
  readonly parallel: number;
  readonly tokens: number;
  readonly seconds: number;
  readonly tokensPerSecond: number;
}

export interface LlamaCppResult {
  readonly options: Omit<LlamaCppOptions, "log">;
  readonly ours: ThroughputRow[];
  readonly llamaCpp: ThroughputRow[];
  /** Why a side could not be measured. */
  readonly unavailable: Record<string, string>;
  readonly llamaCppInfo?: string;
  readonly markdown: string;
}

/** The Node side, written next to the installed package and run there. */
const NODE_SCRIPT = `
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
const cfg = JSON.parse(process.argv[2]);
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath: cfg.modelPath });
// Our tokenizer's ids (BOS only where the file adds one): both sides decode the same prompt.
const prompt = cfg.promptIds;
async function run(n, tokens) {
  const context = await model.createContext({ contextSize: 512 * n, sequences: n, batchSize: 512, threads: cfg.threads });
  const t0 = performance.now();
  const counts = await Promise.all(Array.from({ length: n }, async (_, i) => {
    const seq = context.getSequence();
    let c = 0;
    // No stop on EOS: every sequence generates exactly \`tokens\` tokens.
    for await (const _t of seq.evaluate(prompt, { temperature: cfg.temperature, seed: 1 + i })) {
      if (++c >= tokens) break;
    }
    return c;
  }));
  const seconds = (performance.now() - t0) / 1000;
  await context.dispose();
  const total = counts.reduce((a, b) => a + b, 0);
  return { parallel: n, tokens: total, seconds, tokensPerSecond: total / seconds };
}
await run(1, 16);
const results = [];
for (const n of cfg.parallel) {
  const runs = [];
  for (let k = 0; k < cfg.repeats; k++) runs.push(await run(n, cfg.tokens));
  runs.sort((a, b) => a.tokensPerSecond - b.tokensPerSecond);
  results.push(runs[Math.floor(runs.length / 2)]);
}
console.log(JSON.stringify({ info: \`llama.cpp \${llama.buildType} binary, gpu \${llama.gpu}, \${cfg.threads} thread(s)\`, results }));
`;

async function runCommand(cmd: string, args: string[], cwd?: string, timeoutMs = 300_000) {
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(), timeoutMs);
  try {
    const out = await new Deno.Command(cmd, {
      args,
      cwd,
      stdout: "piped",
      stderr: "piped",
      signal: ctrl.signal,
    }).output();
    const dec = new TextDecoder();
    return {
      code: out.code,
      stdout: dec.decode(out.stdout),
      stderr: dec.decode(out.stderr),
      timedOut: ctrl.signal.aborted,
    };
  } finally {
    clearTimeout(timer);
  }
}

/** Installs node-llama-cpp into `prefix` unless it is there; throws saying what failed. */
async function installLlamaCpp(prefix: string, log: (l: string) => void): Promise<void> {
  const installed = await Deno.stat(`${prefix}/node_modules/node-llama-cpp/package.json`).then(
    () => true,
    () => false,
  );
  if (installed) return;
  log(`installing ${NODE_LLAMA_CPP} into ${prefix} (npm)`);
  let r;
  try {
    r = await runCommand("npm", [
      "install",
      "--prefix",
      prefix,
      NODE_LLAMA_CPP,
      "--no-audit",
      "--no-fund",
      "--loglevel=error",
    ]);
  } catch (e) {
    throw new Error(`cannot run npm: ${(e as Error).message}`);
  }
  if (r.code !== 0 || r.timedOut) {
    throw new Error(
      `npm install ${NODE_LLAMA_CPP} ${r.timedOut ? "timed out" : `exited with ${r.code}`}: ${
        r.stderr.trim().split("\n").slice(-4).join(" / ")
      }`,
    );
  }
  await Deno.writeTextFile(`${prefix}/bench.mjs`, NODE_SCRIPT);
}

/** One round of node-llama-cpp (a node process measuring each parallel level once). */
async function llamaCppRound(
  bm: BenchModel,
  prefix: string,
  o: LlamaCppOptions,
): Promise<{ rows: ThroughputRow[]; info: string }> {
  await Deno.writeTextFile(`${prefix}/bench.mjs`, NODE_SCRIPT);
  const cfg = {
    // The node process runs in the temp dir: a relative MODEL_MIRROR must not follow it there.
    modelPath: resolve(bm.path),
    prompt: o.prompt,
    promptIds: bm.tokenizer.encode(o.prompt),
    tokens: o.tokens,
    parallel: o.parallel,
    threads: o.threads,
    temperature: o.temperature,
    repeats: 1,
  };
  let r;
  try {
    r = await runCommand("node", [`${prefix}/bench.mjs`, JSON.stringify(cfg)], prefix);
  } catch (e) {
    throw new Error(`cannot run node: ${(e as Error).message}`);
  }
  const line = r.stdout.trim().split("\n").pop() ?? "";
  if (r.code !== 0 || !line.startsWith("{")) {
    throw new Error(
      `node-llama-cpp ${r.timedOut ? "timed out" : `exited with ${r.code}`}: ${
        (r.stderr.trim() || r.stdout.trim()).split("\n").slice(-4).join(" / ")
      }`,
    );
  }
  const parsed = JSON.parse(line) as { info: string; results: Omit<ThroughputRow, "engine">[] };
  return {
    rows: parsed.results.map((x) => ({ engine: "node-llama-cpp", ...x })),
    info: parsed.info,
  };
}

/** Our side for one backend: a warmed-up core, measured one round at a time. */
async function oursFor(bm: BenchModel, backend: BackendChoice, o: LlamaCppOptions) {
  const maxN = Math.max(...o.parallel);
  const prompt = bm.tokenizer.encode(o.prompt);
  const bs = DEFAULT_LIMITS.blockSize;
  const blocks = Math.ceil((prompt.length + o.tokens) / bs) * maxN + 16;
  const { core, description } = await makeCore(bm, backend, { numBlocks: blocks, blockSize: bs }, {
    maxRunning: Math.max(64, maxN),
    maxBatchTokens: 512,
  });
  const sampling = (i: number) => ({
    temperature: o.temperature,
    topK: 0,
    topP: 1,
    minP: 0,
    seed: 1 + i,
  });
  try {
    await timedGeneration(core, { prompt, maxTokens: 16, sampling: sampling(0) }); // warm-up (JIT, pipelines)
  } catch (e) {
    await core.close();
    throw e;
  }
  return {
    close: () => core.close(),
    /** N generations of `tokens` tokens at once through the serving core, per parallel level. */
    async round(): Promise<ThroughputRow[]> {
      const rows: ThroughputRow[] = [];
      for (const n of o.parallel) {
        const t0 = performance.now();
        const recs = await Promise.all(
          Array.from(
            { length: n },
            (_, i) => timedGeneration(core, { prompt, maxTokens: o.tokens, sampling: sampling(i) }),
          ),
        );
        const seconds = (performance.now() - t0) / 1000;
        const failed = recs.find((r) => r.error);
        if (failed) throw new Error(`a generation failed with ${failed.error}`);
        const tokens = recs.reduce((s, r) => s + r.tokens.length, 0);
        rows.push({
          engine: `llmserve ${description}`,
          parallel: n,
          tokens,
          seconds,
          tokensPerSecond: tokens / seconds,
        });
      }
      return rows;
    },
  };
}

/** Per (engine, parallel): the run with the median tokens/s. */
function medians(samples: readonly ThroughputRow[]): ThroughputRow[] {
  const groups = new Map<string, ThroughputRow[]>();
  for (const r of samples) {
    const key = `${r.engine}\u0000${r.parallel}`;
    groups.set(key, [...(groups.get(key) ?? []), r]);
  }
  return [...groups.values()].map((g) =>
    [...g].sort((a, b) => a.tokensPerSecond - b.tokensPerSecond)[Math.floor(g.length / 2)]!
  );
}

/**
 * Both sides, measured in alternating rounds (ours, then node-llama-cpp, `repeats` times), so
 * that load from elsewhere on a shared machine falls on both alike; medians are reported.
 */
export async function compareLlamaCpp(bm: BenchModel, o: LlamaCppOptions): Promise<LlamaCppResult> {
  const unavailable: Record<string, string> = {};
  const backends = [...o.backends];
  const prefix = o.prefix ?? await Deno.makeTempDir({ prefix: "node-llama-cpp-" });
  let llamaOk = false;
  if (o.skipLlamaCpp) unavailable["node-llama-cpp"] = "skipped (--no-llama-cpp)";
  else {
    try {
      await installLlamaCpp(prefix, o.log);
      llamaOk = true;
    } catch (e) {
      unavailable["node-llama-cpp"] = (e as Error).message;
    }
  }
  const oursSamples: ThroughputRow[] = [], llamaSamples: ThroughputRow[] = [];
  let info: string | undefined;
  try {
    for (let k = 0; k < o.repeats; k++) {
      o.log(`round ${k + 1} of ${o.repeats}`);
      // One engine alive at a time: an idle WebGPU device on llvmpipe still takes CPU time
      // from whatever runs beside it on a 2-core machine.
      for (const backend of [...backends]) {
        try {
          const side = await oursFor(bm, backend, o);
          try {
            oursSamples.push(...await side.round());
          } finally {
            await side.close();
          }
        } catch (e) {
          unavailable[`llmserve ${backend}`] = (e as Error).message.split("\n")[0]!;
          backends.splice(backends.indexOf(backend), 1);
        }
      }
      if (llamaOk) {
        try {
          const r = await llamaCppRound(bm, prefix, o);
          llamaSamples.push(...r.rows);
          info = r.info;
        } catch (e) {
          unavailable["node-llama-cpp"] = (e as Error).message;
          llamaOk = false;
        }
      }
    }
  } finally {
    if (!o.prefix) await Deno.remove(prefix, { recursive: true }).catch(() => {});
  }
  const ours = medians(oursSamples);
  const llamaCpp = medians(llamaSamples);
  const ref = (n: number) => llamaCpp.find((r) => r.parallel === n)?.tokensPerSecond;
  const rows = [...ours, ...llamaCpp].map((r) => [
    r.engine,
    String(r.parallel),
    String(r.tokens),
    fmt(r.seconds, 2),
    fmt(r.tokensPerSecond, 0),
    ratio(r.tokensPerSecond, ref(r.parallel)),
  ]);
  const scaling = [...ours, ...llamaCpp].reduce<Record<string, ThroughputRow[]>>((m, r) => {
    (m[r.engine] ??= []).push(r);
    return m;
  }, {});
  const scalingLines = Object.entries(scaling).flatMap(([engine, rs]) => {
    const one = rs.find((r) => r.parallel === 1), many = rs.find((r) => r.parallel !== 1);
    return one && many
      ? [
        `- ${engine}: ${many.parallel} sequences give ${
          ratio(many.tokensPerSecond, one.tokensPerSecond)
        } the tokens/s of one`,
      ]
      : [];
  });
  const markdown = [
    `### llmserve vs ${NODE_LLAMA_CPP}`,
    "",
    `Same GGUF (${bm.path.split("/").pop()}), prompt ${
      JSON.stringify(o.prompt)
    }, ${o.tokens} tokens per sequence (EOS ignored on both sides), ` +
    `temperature ${o.temperature}; in-process on both sides (no HTTP); median of ${o.repeats} rounds, the two sides alternating. ${
      info ? `node-llama-cpp: ${info}.` : ""
    }`,
    "",
    table(["engine", "sequences", "tokens", "seconds", "tokens/s", "vs node-llama-cpp"], rows),
    ...scalingLines,
    ...Object.entries(unavailable).map(([k, why]) => `- ${k}: not measured: ${why}`),
    "",
  ].join("\n");
  const { log: _log, ...options } = o;
  return { options, ours, llamaCpp, unavailable, llamaCppInfo: info, markdown };
}
