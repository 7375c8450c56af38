import { HTTP_DEFAULTS } from "../http/defaults.ts";
import { DEFAULT_MODEL } from "../source/model_source.ts";
import { z } from "zod";
import { parseByteSize } from "../util/byte_size.ts";
import { DEFAULT_LIMITS } from "../engine/limits.ts";
import { LOG_LEVELS } from "../util/log_level.ts";
import { ROUTING_POLICIES } from "../cluster/routing.ts";
import { formatKeepAlive, parseKeepAlive } from "../util/duration.ts";
import { EXIT_GRACE_SECONDS } from "./stop_deadline.ts";

/** --max-keep-alive when not given: a day, or --keep-alive where that is longer. */
export const DEFAULT_MAX_KEEP_ALIVE_MS = 24 * 3_600_000;

/**
 * Every setting of the server and the CLI, with the environment variable that can also set
 * it. Command-line flags win over the environment, which wins over the defaults.
 */
export const SETTINGS = {
  model: {
    env: "LLMSERVE_MODEL",
    help: "model path, https:// URL or known name",
    default: DEFAULT_MODEL,
  },
  models: {
    env: "LLMSERVE_MODELS",
    help:
      "several models served at once, loaded on demand (--model repeated; env: comma-separated)",
  },
  modelsConfig: {
    env: "LLMSERVE_MODELS_CONFIG",
    help:
      "a YAML or JSON file of models to serve, each with its own context-length, kv-memory, kv-dtype, keep-alive, aliases and sampling defaults",
  },
  allModels: {
    env: "LLMSERVE_ALL_MODELS",
    help: "serve every GGUF file of the models directory, by the names `deno task models` prints",
    default: "false",
  },
  memoryBudget: {
    env: "LLMSERVE_MEMORY_BUDGET",
    help:
      "memory all loaded models may hold together (weights + KV); the least recently used idle one is unloaded to make room (auto: the free memory at start)",
    default: "auto",
  },
  maxLoadedModels: {
    env: "LLMSERVE_MAX_LOADED_MODELS",
    help: "models loaded at once at most (several models only; default no limit)",
  },
  keepAlive: {
    env: "LLMSERVE_KEEP_ALIVE",
    help:
      "how long an idle model stays loaded: 30s, 5m, 1h, 0 (unload when idle), -1 (forever); a request's keep_alive overrides it",
    default: "5m",
  },
  maxKeepAlive: {
    env: "LLMSERVE_MAX_KEEP_ALIVE",
    help:
      `the longest keep_alive a request may ask (longer ones are lowered to it); -1 lets requests keep models forever (default ${
        formatKeepAlive(DEFAULT_MAX_KEEP_ALIVE_MS)
      }, or --keep-alive if longer)`,
  },
  tokenizer: { env: "LLMSERVE_TOKENIZER", help: "llama2.c tokenizer.bin for a .bin checkpoint" },
  modelsDir: { env: "MODELS_DIR", help: "where downloaded models are kept" },
  backend: {
    env: "LLMSERVE_BACKEND",
    help:
      "auto | cpu | webgpu | reference (auto times a decode step on cpu and webgpu, keeps the faster)",
    default: "auto",
  },
  threads: {
    env: "LLMSERVE_THREADS",
    help: "CPU engine threads (default: the machine's cores)",
  },
  kvDtype: {
    env: "LLMSERVE_KV_DTYPE",
    help: "KV cache elements of the cpu and webgpu engines: f16 | f32 (default f16)",
  },
  contextLength: { env: "LLMSERVE_CONTEXT_LENGTH", help: "override the model's context length" },
  host: { env: "LLMSERVE_HOST", help: "address to listen on", default: "127.0.0.1" },
  port: { env: "LLMSERVE_PORT", help: "port to listen on (0 picks a free one)", default: 8000 },
  kvMemory: {
    env: "LLMSERVE_KV_MEMORY",
    help:
      "memory for the paged KV cache (auto: a full context per running sequence, within the device's limits)",
    default: DEFAULT_LIMITS.kvMemory,
  },
  blockSize: {
    env: "LLMSERVE_BLOCK_SIZE",
    help: "tokens per KV block",
    default: DEFAULT_LIMITS.blockSize,
  },
  maxBatchTokens: {
    env: "LLMSERVE_MAX_BATCH_TOKENS",
    help: "tokens computed per step at most",
    default: DEFAULT_LIMITS.maxBatchTokens,
  },
  maxRunning: {
    env: "LLMSERVE_MAX_RUNNING",
    help: "sequences in one step at most",
    default: DEFAULT_LIMITS.maxRunning,
  },
  maxWaiting: {
    env: "LLMSERVE_MAX_WAITING",
    help: "queued requests that cannot start yet before answering overloaded",
    default: DEFAULT_LIMITS.maxWaiting,
  },
  pipelineDepth: {
    env: "LLMSERVE_PIPELINE_DEPTH",
    help:
      `steps submitted ahead of their results (1-${DEFAULT_LIMITS.maxPipelineDepth}; default ${DEFAULT_LIMITS.pipelineDepth}; on webgpu ${DEFAULT_LIMITS.pipelineDepth}-${DEFAULT_LIMITS.readbackPipelineDepth}, adapted to the step's cost)`,
  },
  apiKey: { env: "LLMSERVE_API_KEYS", help: "accepted API keys (env: comma-separated)" },
  nats: {
    env: "LLMSERVE_NATS",
    help: "NATS server(s) to also serve as a replica on: nats://[user:pass@|token@]host:port",
  },
  natsCreds: { env: "LLMSERVE_NATS_CREDS", help: "NATS .creds file (JWT + NKey seed)" },
  routing: {
    env: "LLMSERVE_ROUTING",
    help: `router: ${ROUTING_POLICIES.join(" | ")}`,
    default: "prefix",
  },
  byModel: {
    env: "LLMSERVE_BY_MODEL",
    help:
      "router: replicas may serve different models; each request goes to one serving its `model`",
    default: "false",
  },
  drainTimeout: {
    env: "LLMSERVE_DRAIN_TIMEOUT",
    help:
      `seconds to let in-flight requests finish on SIGTERM; the process exits at most ${EXIT_GRACE_SECONDS} s after it`,
    default: HTTP_DEFAULTS.drainTimeoutSeconds,
  },
  servedModelName: {
    env: "LLMSERVE_SERVED_MODEL_NAMES",
    help: "name clients may give as `model` (repeatable; env: comma-separated)",
  },
  logFormat: {
    env: "LLMSERVE_LOG_FORMAT",
    help: "request log lines: text | json | off",
    default: "text",
  },
  logLevel: {
    env: "LLMSERVE_LOG_LEVEL",
    help: "error | warn | info | debug (debug adds health/ready/metrics probes)",
    default: "info",
  },
  logProbes: {
    env: "LLMSERVE_LOG_PROBES",
    help: "log successful /health, /ready and /metrics requests too",
    default: "false",
  },
  chatTemplate: {
    env: "LLMSERVE_CHAT_TEMPLATE",
    help: "Jinja chat template file used instead of the model's",
  },
  metricsPublic: {
    env: "LLMSERVE_METRICS_PUBLIC",
    help: "serve /metrics without an API key",
    default: "false",
  },
  grammarPreload: {
    env: "LLMSERVE_GRAMMAR_PRELOAD",
    help:
      "start the structured-output engine (XGrammar over the vocabulary) once the server is ready, so the first response_format request does not wait for it (~100 MiB on a 150k vocabulary); false: start it on the first such request",
    default: "true",
  },
  cacheScope: {
    env: "LLMSERVE_CACHE_SCOPE",
    help: "who shares the result and prefix caches: key (each API key its own) | global",
    default: "key",
  },
  resultCache: {
    env: "LLMSERVE_RESULT_CACHE",
    help: "memory for cached answers to deterministic requests, e.g. 64MiB (0: off)",
    default: "0",
  },
  maxConnections: {
    env: "LLMSERVE_MAX_CONNECTIONS",
    help: "open client connections at most (default: from the open-file limit)",
  },
  headerTimeout: {
    env: "LLMSERVE_HEADER_TIMEOUT",
    help: "seconds a connection has to send a request's headers",
    default: HTTP_DEFAULTS.headerTimeoutSeconds,
  },
  bodyTimeout: {
    env: "LLMSERVE_BODY_TIMEOUT",
    help: "seconds a whole request may take to arrive",
    default: HTTP_DEFAULTS.bodyTimeoutSeconds,
  },
  keepAliveTimeout: {
    env: "LLMSERVE_KEEP_ALIVE_TIMEOUT",
    help: "seconds an idle keep-alive connection is kept",
    default: HTTP_DEFAULTS.keepAliveTimeoutSeconds,
  },
  dataDir: {
    env: "LLMSERVE_DATA_DIR",
    help:
      "where batch files and results live (default $XDG_DATA_HOME/llmserve, else ~/.local/share/llmserve)",
  },
  batchConcurrency: {
    env: "LLMSERVE_BATCH_CONCURRENCY",
    help: "batch lines generating at once, beside interactive traffic",
    default: 4,
  },
  batchMaxFileSize: {
    env: "LLMSERVE_BATCH_MAX_FILE_SIZE",
    help: "largest batch input file",
    default: "100MiB",
  },
  batchMaxLines: {
    env: "LLMSERVE_BATCH_MAX_LINES",
    help: "most request lines in one batch input file",
    default: 50000,
  },
  batchMaxActive: {
    env: "LLMSERVE_BATCH_MAX_ACTIVE",
    help: "most unfinished batches at once",
    default: 16,
  },
  batchMaxUploads: {
    env: "LLMSERVE_BATCH_MAX_UPLOADS",
    help: "file uploads streaming at once over the server (more get 429 with Retry-After)",
    default: 8,
  },
  batchMaxUploadsPerKey: {
    env: "LLMSERVE_BATCH_MAX_UPLOADS_PER_KEY",
    help: "file uploads streaming at once for one API key (more get 429 with Retry-After)",
    default: 2,
  },
  batchMaxStorage: {
    env: "LLMSERVE_BATCH_MAX_STORAGE",
    help:
      "bytes of files (inputs and outputs) one API key may keep; without keys, the whole data dir",
    default: "10GiB",
  },
  batchMaxFiles: {
    env: "LLMSERVE_BATCH_MAX_FILES",
    help: "files (inputs and outputs) one API key may keep; without keys, the whole data dir",
    default: 1000,
  },
  batchRetention: {
    env: "LLMSERVE_BATCH_RETENTION",
    help:
      "how long a finished batch's input, output and error files are kept, e.g. 24h (-1: until deleted)",
    default: "720h",
  },
  corsOrigin: {
    env: "LLMSERVE_CORS_ORIGINS",
    help:
      "origin whose pages may use the API, e.g. http://localhost:* (repeatable; env: comma-separated)",
  },
  allowedHost: {
    env: "LLMSERVE_ALLOWED_HOSTS",
    help: "host name served besides IPs and localhost (repeatable; env: comma-separated)",
  },
} as const;

/** Settings that take a list: repeated flags, or a comma-separated variable. */
const LIST_SETTINGS: ReadonlySet<string> = new Set([
  "models",
  "apiKey",
  "servedModelName",
  "corsOrigin",
  "allowedHost",
]);

const byteSize = (fallback: string) =>
  z.string().default(fallback).transform((s, ctx) => {
    try {
      return parseByteSize(s);
    } catch (e) {
      ctx.addIssue({ code: "custom", message: (e as Error).message });
      return z.NEVER;
    }
  });

/** The default a setting takes when neither a flag nor the environment sets it, as --help shows it. */
export function settingDefault(name: SettingName): string | number | undefined {
  const s = SETTINGS[name];
  return "default" in s ? s.default : undefined;
}

const D = SETTINGS;

export type SettingName = keyof typeof SETTINGS;

// Messages name no setting: the caller prefixes the flag or variable the value came from.
const positiveInt = () =>
  z.coerce.number({ error: "must be a number" }).int("must be an integer").positive(
    "must be positive",
  );

/** A switch: the flag alone (true), or a variable set to true, false, 1 or 0. */
const flag = (value = false) =>
  z.union([
    z.boolean(),
    z.enum(["true", "false", "1", "0"], { error: "expected true, false, 1 or 0" }).transform((v) =>
      v === "true" || v === "1"
    ),
  ]).default(value);

const seconds = () =>
  z.coerce.number({ error: "must be a number of seconds" }).positive("must be positive");

export const ConfigSchema = z.object({
  model: z.string().min(1).default(D.model.default),
  models: z.array(z.string().min(1, "a model cannot be empty")).default([]),
  modelsConfig: z.string().min(1).optional(),
  allModels: flag(),
  memoryBudget: z.string().default(D.memoryBudget.default).transform((s, ctx) => {
    if (s.trim().toLowerCase() === "auto") return undefined;
    try {
      return parseByteSize(s);
    } catch (e) {
      ctx.addIssue({ code: "custom", message: (e as Error).message });
      return z.NEVER;
    }
  }),
  maxLoadedModels: positiveInt().optional(),
  keepAlive: z.string().default(D.keepAlive.default).transform((s, ctx) => {
    const ms = parseKeepAlive(s);
    if (typeof ms === "number") return ms;
    ctx.addIssue({ code: "custom", message: ms });
    return z.NEVER;
  }),
  maxKeepAlive: z.string().optional().transform((s, ctx) => {
    if (s === undefined) return undefined;
    const ms = parseKeepAlive(s);
    if (typeof ms === "number") return ms;
    ctx.addIssue({ code: "custom", message: ms });
    return z.NEVER;
  }),
  tokenizer: z.string().min(1).optional(),
  modelsDir: z.string().min(1).optional(),
  backend: z.enum(["webgpu", "cpu", "reference", "auto"]).default(D.backend.default),
  threads: positiveInt().max(256, "must be at most 256").optional(),
  kvDtype: z.enum(["f16", "f32"]).optional(),
  contextLength: positiveInt().optional(),
  host: z.string().min(1).default(D.host.default),
  port: z.coerce.number({ error: "must be a number" }).int("must be an integer").min(
    0,
    "must be 0 to 65535",
  ).max(65535, "must be 0 to 65535").default(D.port.default),
  // "auto" (the default): sized from the model and the device at start-up (planKvCache).
  kvMemory: z.string().default(D.kvMemory.default).transform((s, ctx) => {
    if (s.trim().toLowerCase() === "auto") return undefined;
    try {
      return parseByteSize(s);
    } catch (e) {
      ctx.addIssue({ code: "custom", message: (e as Error).message });
      return z.NEVER;
    }
  }),
  blockSize: positiveInt().default(DEFAULT_LIMITS.blockSize),
  maxBatchTokens: positiveInt().default(DEFAULT_LIMITS.maxBatchTokens),
  maxRunning: positiveInt().default(DEFAULT_LIMITS.maxRunning),
  maxWaiting: positiveInt().default(DEFAULT_LIMITS.maxWaiting),
  pipelineDepth: positiveInt().max(
    DEFAULT_LIMITS.maxPipelineDepth,
    `must be at most ${DEFAULT_LIMITS.maxPipelineDepth}`,
  ).optional(),
  apiKey: z.array(
    z.string().min(8, "API keys must have at least 8 characters").regex(
      /^[\x21-\x7e]+$/,
      "API keys must be printable ASCII without spaces (a key with a space can never match " +
        "'Authorization: Bearer <key>')",
    ),
  ).default([]),
  drainTimeout: z.coerce.number({ error: "must be a number" }).nonnegative(
    "must be 0 or more seconds",
  ).default(D.drainTimeout.default),
  nats: z.string().min(1).optional(),
  natsCreds: z.string().min(1).optional(),
  routing: z.enum(ROUTING_POLICIES).default(D.routing.default),
  byModel: flag(),
  servedModelName: z.array(z.string().min(1, "a served model name cannot be empty")).default([]),
  logFormat: z.enum(["text", "json", "off"]).default(D.logFormat.default),
  logLevel: z.enum(LOG_LEVELS).default("info"),
  logProbes: flag(),
  chatTemplate: z.string().min(1).optional(),
  metricsPublic: flag(),
  grammarPreload: flag(D.grammarPreload.default === "true"),
  // Off by default: benchmarks and soak runs repeat requests to measure the engine, and a
  // cache would answer them instead.
  resultCache: byteSize(D.resultCache.default),
  cacheScope: z.enum(["key", "global"]).default(D.cacheScope.default),
  maxConnections: positiveInt().optional(),
  headerTimeout: seconds().default(D.headerTimeout.default),
  bodyTimeout: seconds().default(D.bodyTimeout.default),
  keepAliveTimeout: seconds().default(D.keepAliveTimeout.default),
  dataDir: z.string().min(1).optional(),
  batchConcurrency: positiveInt().default(D.batchConcurrency.default),
  batchMaxFileSize: byteSize(D.batchMaxFileSize.default),
  batchMaxLines: positiveInt().default(D.batchMaxLines.default),
  batchMaxActive: positiveInt().default(D.batchMaxActive.default),
  batchMaxUploads: positiveInt().default(D.batchMaxUploads.default),
  batchMaxUploadsPerKey: positiveInt().default(D.batchMaxUploadsPerKey.default),
  batchMaxStorage: byteSize(D.batchMaxStorage.default),
  batchMaxFiles: positiveInt().default(D.batchMaxFiles.default),
  batchRetention: z.string().default(D.batchRetention.default).transform((s, ctx) => {
    const ms = parseKeepAlive(s);
    if (typeof ms === "number") return ms;
    ctx.addIssue({ code: "custom", message: ms });
    return z.NEVER;
  }),
  corsOrigin: z.array(
    z.string().regex(
      /^(\*|null|[a-z][a-z0-9+.-]*:\/\/[^/\s]+)$/i,
      "an origin is scheme://host[:port] (globs with * allowed, e.g. http://localhost:*), " +
        "'null', or '*'",
    ),
  ).default([]),
  allowedHost: z.array(
    z.string().regex(/^[a-z0-9.-]+$/i, "a host name is letters, digits, dots and dashes"),
  ).default([]),
});

export type Config = z.infer<typeof ConfigSchema>;

/**
 * Builds the configuration from parsed flags and the environment, and validates it. Throws an
 * Error whose message lists every invalid setting with the value received.
 */
export function resolveConfig(
  flags: Partial<Record<SettingName, unknown>>,
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): Config {
  const raw: Record<string, unknown> = {};
  for (const [name, { env: envName }] of Object.entries(SETTINGS)) {
    const fromFlag = flags[name as SettingName];
    const fromEnv = env(envName);
    if (fromFlag !== undefined) raw[name] = fromFlag;
    else if (fromEnv !== undefined && fromEnv !== "") {
      raw[name] = LIST_SETTINGS.has(name)
        ? fromEnv.split(",").map((s) => s.trim()).filter(Boolean)
        : fromEnv;
    }
  }
  for (const name of LIST_SETTINGS) {
    if (raw[name] !== undefined && !Array.isArray(raw[name])) raw[name] = [raw[name]];
  }
  const parsed = ConfigSchema.safeParse(raw);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((i) => {
      const name = String(i.path[0]) as SettingName;
      // Name what the user typed: the kebab-case flag, or the variable (with the flag it
      // stands for) when the value came from the environment.
      const flag = flagName(name);
      const where = flags[name] !== undefined
        ? flag
        : SETTINGS[name] === undefined
        ? flag
        : `${SETTINGS[name].env} (${flag})`;
      // API keys are secrets: say which one, never echo it.
      if (name === "apiKey") return `${where} #${Number(i.path[1] ?? 0) + 1}: ${i.message}`;
      if (LIST_SETTINGS.has(name) && typeof i.path[1] === "number") {
        const item = (raw[name] as unknown[])[i.path[1]];
        return `${where}: ${i.message} (received ${JSON.stringify(item)})`;
      }
      const received = JSON.stringify(raw[name]);
      return i.message.includes(received)
        ? `${where}: ${i.message}`
        : `${where}: ${i.message} (received ${received})`;
    });
    throw new Error(`Invalid configuration:\n  ${lines.join("\n  ")}`);
  }
  return parsed.data;
}

/**
 * The longest keep_alive a request may ask (ms, Infinity: no cap). Given, it must be at least
 * --keep-alive: otherwise a request naming no keep_alive would get more than any naming one.
 */
export function maxKeepAlive(c: Pick<Config, "keepAlive" | "maxKeepAlive">): number {
  if (c.maxKeepAlive === undefined) return Math.max(DEFAULT_MAX_KEEP_ALIVE_MS, c.keepAlive);
  if (c.keepAlive > c.maxKeepAlive) {
    throw new Error(
      `Invalid configuration: --keep-alive ${formatKeepAlive(c.keepAlive)} is longer than ` +
        `--max-keep-alive ${formatKeepAlive(c.maxKeepAlive)}; raise --max-keep-alive ` +
        `(-1 lets requests keep models forever) or lower --keep-alive`,
    );
  }
  return c.maxKeepAlive;
}

/** `maxBatchTokens` -> `--max-batch-tokens`. */
export function flagName(name: string): string {
  return "--" + name.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase());
}
