/**
 * `serve`'s flags: their names and aliases, `--help`, and their parsing into the validated
 * configuration, apart from the server itself, so that the launcher (`main.ts launch serve`)
 * validates them and derives the permissions without loading the server's module graph: it
 * stays the server's parent all its life, and every module it loads is memory it keeps.
 */
import { parseFlags } from "./args.ts";
import { PEER_FLAGS, peerFlagError, unknownArgumentsError } from "./flag_suggestions.ts";
import type { RunNeeds } from "./permissions.ts";
import { versionLine } from "./version.ts";
import {
  type Config,
  resolveConfig,
  settingDefault,
  type SettingName,
  SETTINGS,
} from "./config.ts";
import { readModelsConfig } from "./models_config.ts";

/** The Batch API's flags: a server's and a router's alike (both keep files and batches). */
export const BATCH_FLAG_NAMES: Record<string, SettingName> = {
  "data-dir": "dataDir",
  "batch-concurrency": "batchConcurrency",
  "batch-max-file-size": "batchMaxFileSize",
  "batch-max-lines": "batchMaxLines",
  "batch-max-active": "batchMaxActive",
  "batch-max-uploads": "batchMaxUploads",
  "batch-max-uploads-per-key": "batchMaxUploadsPerKey",
  "batch-max-storage": "batchMaxStorage",
  "batch-max-files": "batchMaxFiles",
  "batch-retention": "batchRetention",
};

export const FLAG_NAMES: Record<string, SettingName> = {
  "model": "model",
  "all-models": "allModels",
  "models-config": "modelsConfig",
  "memory-budget": "memoryBudget",
  "max-loaded-models": "maxLoadedModels",
  "keep-alive": "keepAlive",
  "max-keep-alive": "maxKeepAlive",
  "tokenizer": "tokenizer",
  "backend": "backend",
  "threads": "threads",
  "kv-dtype": "kvDtype",
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
  "served-model-name": "servedModelName",
  "log-format": "logFormat",
  "log-level": "logLevel",
  "log-probes": "logProbes",
  "chat-template": "chatTemplate",
  "metrics-public": "metricsPublic",
  "result-cache": "resultCache",
  "grammar-preload": "grammarPreload",
  "cache-scope": "cacheScope",
  "nats": "nats",
  "nats-creds": "natsCreds",
  "max-connections": "maxConnections",
  "header-timeout": "headerTimeout",
  "body-timeout": "bodyTimeout",
  "keep-alive-timeout": "keepAliveTimeout",
  "cors-origin": "corsOrigin",
  "allowed-host": "allowedHost",
  ...BATCH_FLAG_NAMES,
};

/** llama-server's spellings of the same flags (`llama-server -m x -c 4096 --port 8080`). */
export const SERVE_ALIASES: Readonly<Record<string, string>> = {
  m: "model",
  c: "context-length",
  "ctx-size": "context-length",
  t: "threads",
  // vLLM's spelling.
  "max-model-len": "context-length",
  // llama-server's slots are our running sequences: at most that many in one step.
  parallel: "max-running",
  np: "max-running",
  ngl: "n-gpu-layers",
};

/** Flags that take no value. */
const BOOLEAN_FLAGS = ["metrics-public", "log-probes", "all-models", "grammar-preload"];

function usage(): string {
  const rows = Object.entries(FLAG_NAMES).map(([flag, name]) => {
    const d = settingDefault(name);
    const shown = d === undefined ? "" : `, default ${d}`;
    return `  --${flag.padEnd(18)} ${SETTINGS[name].help} [env ${SETTINGS[name].env}${shown}]`;
  });
  return `Usage: deno task start [options]
${rows.join("\n")}
  --help               this text
  --version            print the version and exit
llama-server's names work too: -m (--model), -c / --ctx-size (--context-length), -t (--threads),
  -np / --parallel (--max-running); and vLLM's --max-model-len (--context-length).

Examples:
  deno task start                                         stories260K on http://127.0.0.1:8000/
  deno task start --model stories260K-q8_0                a file in the models dir or mirror, by stem
  deno task start --model /data/models/llama.gguf --host 0.0.0.0 --port 8080
  deno task start --model https://huggingface.co/<org>/<repo>/resolve/main/<file>.gguf
  LLMSERVE_API_KEYS=key-one-123,key-two-456 deno task start --backend cpu --kv-memory 1GiB
  deno task start -m stories260K-q8_0 -c 256 --port 8080  llama-server's short flags
  deno task models                                        list the models it can find`;
}

/** What `--help` or `--version` print, or undefined for a run. */
export function serveInfo(argv: readonly string[]): string | undefined {
  if (argv.includes("--help")) return usage();
  if (argv.includes("--version")) return versionLine();
  return undefined;
}

/** What a server with this configuration touches, for the launcher's permissions. */
export function serveNeeds(c: Config): RunNeeds {
  const fromFile = c.modelsConfig === undefined ? [] : readModelsConfig(c.modelsConfig);
  return {
    model: c.model,
    models: [...c.models, ...fromFile.map((e) => e.model)],
    ...(c.modelsConfig === undefined ? {} : { readFiles: [c.modelsConfig] }),
    tokenizer: c.tokenizer,
    modelsDir: c.modelsDir,
    host: c.host,
    nats: c.nats,
    natsCreds: c.natsCreds,
    chatTemplate: c.chatTemplate,
    batchQueue: { dataDir: c.dataDir },
  };
}

/** Parses `serve` flags into the validated configuration. Exported for tests. */
export function parseServeArgs(argv: string[], env?: (name: string) => string | undefined): Config {
  const valueFlags = Object.keys(FLAG_NAMES).filter((f) => !BOOLEAN_FLAGS.includes(f));
  const { values: flags, unknown, typed } = parseFlags(argv, {
    string: [...valueFlags, ...Object.keys(PEER_FLAGS)],
    collect: ["model", "api-key", "served-model-name", "cors-origin", "allowed-host"],
    boolean: ["help", "version", ...BOOLEAN_FLAGS],
    aliases: SERVE_ALIASES,
  });
  for (const flag of Object.keys(PEER_FLAGS)) {
    if (flags[flag] !== undefined) throw new Error(peerFlagError(flag, typed[flag] ?? `--${flag}`));
  }
  if (unknown.length > 0) {
    const known = [
      ...Object.keys(FLAG_NAMES),
      "help",
      "version",
      ...Object.keys(SERVE_ALIASES).filter((a) => a.length > 2),
    ];
    throw new Error(unknownArgumentsError(unknown, known, "deno task start"));
  }
  const named: Partial<Record<SettingName, unknown>> = {};
  for (const [flag, name] of Object.entries(FLAG_NAMES)) {
    const v = flags[flag];
    // parseArgs reports an absent boolean flag as false, which would hide the environment's.
    if (
      BOOLEAN_FLAGS.includes(flag) &&
      !argv.some((a) => a === `--${flag}` || a.startsWith(`--${flag}=`))
    ) {
      continue;
    }
    if (v !== undefined && !(Array.isArray(v) && v.length === 0)) named[name] = v;
  }
  // --model given several times serves them all (lib/cli/serve_models.ts); once, as always.
  if (Array.isArray(named.model)) {
    const specs = named.model as string[];
    if (specs.length > 1) named.models = specs;
    named.model = specs[0];
  }
  return resolveConfig(named, env);
}
