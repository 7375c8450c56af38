import { openModel } from "./open_model.ts";
import { parseFlags } from "./args.ts";
import { whenLauncherGone } from "./parent_watch.ts";
import { versionLine } from "./version.ts";
import { ServingCore } from "../../actors/core.ts";
import { formatBytes } from "../util/byte_size.ts";
import { type Config, resolveConfig, type SettingName, SETTINGS } from "./config.ts";
import { CoreBackend } from "../serving/core_backend.ts";
import { createEngine } from "../serving/engine_factory.ts";
import { FAULT_ENV, FaultInjector } from "../engine/fault_injection.ts";
import { type Engine, GREEDY, stepTokens } from "../engine/engine.ts";
import { createApp } from "../http/app.ts";
import { serveService } from "../http/serve.ts";
import { ServiceMetrics } from "../http/service_metrics.ts";
import { kvBlockBytes } from "../engine/kv_budget.ts";

const FLAG_NAMES: Record<string, SettingName> = {
  "model": "model",
  "tokenizer": "tokenizer",
  "backend": "backend",
  "context-length": "contextLength",
  "host": "host",
  "port": "port",
  "kv-memory": "kvMemory",
  "block-size": "blockSize",
  "max-batch-tokens": "maxBatchTokens",
  "max-running": "maxRunning",
  "max-waiting": "maxWaiting",
  "pipeline-depth": "pipelineDepth",
  "api-key": "apiKey",
  "drain-timeout": "drainTimeout",
  "models-dir": "modelsDir",
};

function usage(): string {
  const rows = Object.entries(FLAG_NAMES).map(([flag, name]) =>
    `  --${flag.padEnd(18)} ${SETTINGS[name].help} [env ${SETTINGS[name].env}]`
  );
  return `Usage: deno task start [options]
${rows.join("\n")}
  --help               this text
  --version            print the version and exit

Examples:
  deno task start                                         stories260K on http://127.0.0.1:8000/
  deno task start --model stories260K-q8_0                a file in the models dir or mirror, by stem
  deno task start --model /data/models/llama.gguf --host 0.0.0.0 --port 8080
  deno task start --model https://huggingface.co/<org>/<repo>/resolve/main/<file>.gguf
  LLMSERVE_API_KEYS=key-one-123,key-two-456 deno task start --backend cpu --kv-memory 1GiB
  deno task models                                        list the models it can find`;
}

/** The flags `serve` takes, for the parser. */
const SERVE_FLAGS = {
  string: Object.keys(FLAG_NAMES),
  collect: ["api-key"],
  boolean: ["help", "version"],
};

/** Parses `serve` flags into the validated configuration. Exported for tests. */
export function parseServeArgs(argv: string[], env?: (name: string) => string | undefined): Config {
  const { values, unknown } = parseFlags(argv, SERVE_FLAGS);
  if (unknown.length > 0) throw new Error(`Unknown argument(s): ${unknown.join(" ")}\n${usage()}`);
  const named: Partial<Record<SettingName, unknown>> = {};
  for (const [flag, name] of Object.entries(FLAG_NAMES)) {
    const v = values[flag];
    if (v !== undefined && !(Array.isArray(v) && v.length === 0)) named[name] = v;
  }
  return resolveConfig(named, env);
}

/** What `--help` or `--version` print, or undefined for a run. */
export function serveInfo(argv: readonly string[]): string | undefined {
  if (argv.includes("--help")) return usage();
  if (argv.includes("--version")) return versionLine();
  return undefined;
}

/** `serve` command: loads the model, starts the actors and the HTTP server, drains on SIGTERM. */
export async function serveCommand(argv: string[]): Promise<number> {
  const info = serveInfo(argv);
  if (info !== undefined) {
    console.log(info);
    return 0;
  }
  const config = parseServeArgs(argv);
  const log = (line: string) => console.error(line);
  const { source, model, tokenizer } = await openModel(config.model, {
    modelsDir: config.modelsDir,
    tokenizer: config.tokenizer,
    contextLength: config.contextLength,
    purpose: "serve",
  });
  const blockBytes = kvBlockBytes(model.config, config.blockSize);
  const numBlocks = Math.floor(config.kvMemory / blockBytes);
  const minBlocks = Math.ceil(model.config.contextLength / config.blockSize);
  if (numBlocks < minBlocks) {
    throw new Error(
      `--kv-memory ${
        formatBytes(config.kvMemory)
      } holds ${numBlocks} KV blocks; one full-context sequence needs ${minBlocks} (${
        formatBytes(minBlocks * blockBytes)
      })`,
    );
  }
  const kv = { numBlocks, blockSize: config.blockSize };
  const limits = { maxBatchTokens: config.maxBatchTokens, maxSeqs: config.maxRunning };
  const { engine, description } = await createEngine(model, config.backend, kv, limits);
  await warmUp(engine, tokenizer.bosId);
  // Test-only: LLMSERVE_FAULT_STEPS makes chosen engine steps fail (see lib/fault_injection.ts).
  const faults = FaultInjector.fromEnv();
  const withFaults = (e: Engine): Engine => (faults ? faults.wrap(e) : e);
  const metrics = new ServiceMetrics();
  let restartsSeen = 0;
  const core: ServingCore = new ServingCore({
    engine: withFaults(engine),
    engineFactory: async () =>
      withFaults((await createEngine(model, config.backend, kv, limits)).engine),
    codec: tokenizer,
    maxInFlight: config.pipelineDepth,
    scheduler: {
      maxBatchTokens: config.maxBatchTokens,
      maxRunning: config.maxRunning,
      maxWaiting: config.maxWaiting,
    },
    executor: {
      onStep: (r) => {
        // Restarts are counted from the executor, not from failed steps: every step already
        // handed to a dead engine fails too. The count is synced on the step after a restart.
        for (; restartsSeen < core.executor.restarts; restartsSeen++) {
          metrics.observeExecutorRestart();
        }
        if (r.error !== undefined) return;
        const tokens = stepTokens(r.plan);
        metrics.observeStep({ durationMs: r.durationMs, batchSize: r.plan.seqs.length, tokens });
      },
    },
  });
  const modelName = source.modelPath.split("/").pop()!.replace(/\.(gguf|bin)$/, "");
  const backend = new CoreBackend(modelName, core, tokenizer, model.chatTemplate);
  const service = createApp({
    backend,
    metrics,
    apiKeys: config.apiKey,
    drainTimeoutMs: config.drainTimeout * 1000,
  });
  const c = model.config;
  const server = serveService(service, {
    hostname: config.host,
    port: config.port,
    drainTimeoutMs: config.drainTimeout * 1000,
    onListen: (addr) => {
      log([
        `llmserve ready`,
        `  model     ${source.modelPath} (${c.nLayers} layers, dim ${c.dim}, ${c.nHeads}/${c.nKvHeads} heads, vocab ${c.vocabSize}, context ${c.contextLength})`,
        `  backend   ${description}`,
        `  kv cache  ${numBlocks} blocks x ${config.blockSize} tokens = ${
          formatBytes(numBlocks * blockBytes)
        } (${numBlocks * config.blockSize} tokens)`,
        `  limits    ${config.maxBatchTokens} tokens/step, ${config.maxRunning} running, ${config.maxWaiting} waiting, pipeline depth ${config.pipelineDepth}`,
        `  auth      ${config.apiKey.length > 0 ? `${config.apiKey.length} API key(s)` : "off"}`,
        `  url       http://${addr.hostname}:${addr.port}/  (playground; API under /v1)`,
        ...(faults
          ? [
            `  faults    ${FAULT_ENV}=${Deno.env.get(FAULT_ENV)} (test-only fault injection is on)`,
          ]
          : []),
      ].join("\n"));
    },
  });
  whenLauncherGone(() => void server.stop());
  const result = await server.closed;
  await core.close();
  log(
    `drained: ${
      result.completed
        ? "all in-flight generations finished"
        : `${result.aborted} aborted at the deadline`
    }`,
  );
  return 0;
}

/**
 * One throw-away step before the server says it is ready: WebGPU compiles its pipelines on
 * first use (about a second on llvmpipe), which would otherwise land on the first request's
 * time to first token. It writes block 0's first slot, which the next owner overwrites.
 */
async function warmUp(engine: Engine, bosId: number): Promise<void> {
  const seqId = -1;
  await engine.step({
    stepId: -1,
    seqs: [{
      seqId,
      tokens: [bosId],
      startPos: 0,
      blockTable: [0],
      sample: true,
      sampling: GREEDY,
    }],
  });
  engine.release?.(seqId);
}
