/**
 * The one table of settings: every flag of every command, with its other spellings, its
 * environment variable, its `--models-config` key, its default, its help and its validation.
 * The flag parser (flag_parser.ts), each command's `--help` (help.ts), the models file
 * (models_config.ts) and docs/settings.md (`deno task docs:settings`) are all read from it.
 *
 * A row's key is the setting's name in the configuration; its flag is the key in kebab case
 * (`maxBatchTokens` -> `--max-batch-tokens`). Precedence: a flag wins over the environment
 * (for the commands that read it), which wins over the default.
 */
import { z } from "zod";
import { DEFAULT_MODEL } from "../source/model_source.ts";
import { DEFAULT_LIMITS } from "../engine/limits.ts";
import { BACKENDS } from "../engine/backend_choice.ts";
import { DEFAULT_EMBD_NORMALIZE } from "../engine/embedding_norm.ts";
import { type Pooling, POOLINGS } from "../model/pooling_type.ts";
import { rerankPromptProblem } from "../core/rerank_prompt.ts";
import { SCHEDULER_DEFAULTS } from "../core/scheduler_config.ts";
import { HTTP_DEFAULTS } from "../http/defaults.ts";
import { flagNumber, numberDefault } from "../http/request_params.ts";
import { LOG_LEVELS } from "../util/log_level.ts";
import { ROUTING_POLICIES } from "../cluster/routing.ts";
import { CLUSTER_DEFAULTS } from "../cluster/cluster_defaults.ts";
import { formatKeepAlive } from "../util/duration.ts";
import { GRAMMAR_LIMITS } from "../grammar/grammar_limits.ts";
import { EXIT_GRACE_SECONDS } from "./stop_deadline.ts";
import type { CommandName } from "./commands.ts";
import { PLAN_SHAPE_NAMES } from "../cluster/plan_model.ts";
import { parseBandwidth, parsed, parseLatency } from "../cluster/plan_hosts.ts";
import { RANK_BY, type RankBy } from "../cluster/plan_layouts.ts";
import { HEAD_PLACES, type HeadPlace } from "../cluster/plan_cost.ts";
import { CALIBRATION_OUT } from "../cluster/plan_calibration.ts";
import {
  byteSize,
  byteSizeOrAuto,
  duration,
  intIn,
  numberIn,
  port,
  positiveInt,
  seconds,
  secondsOrZero,
  text,
  toggle,
} from "./setting_values.ts";

export interface SettingRow {
  /** Where docs/settings.md lists it. */
  readonly group: string;
  readonly help: string;
  /** The commands that take it as a flag. */
  readonly commands: readonly CommandName[];
  /** Reads the flag's (or the variable's) text; undefined where the setting may be absent. */
  readonly schema: z.ZodType;
  /** `value` takes one; `switch` none (a variable: true/false/1/0); `list` repeats. */
  readonly kind?: "value" | "switch" | "list";
  /** The value when nothing sets it, as --help shows it (it goes through the schema too). */
  readonly default?: string | number | boolean;
  /** Other spellings, without dashes: llama.cpp's `m`, vLLM's `max-model-len`. */
  readonly aliases?: readonly string[];
  readonly env?: string;
  /** A `--models-config` model entry may set it, under the flag's name. */
  readonly perModel?: true;
  /** Given more than once, the values go to this list setting (and the first stays here). */
  readonly repeatsInto?: string;
  /** No flag of its own: set by another's repeats (repeatsInto) or its variable. */
  readonly noFlag?: true;
  /** What --help says of it for a command where it means something narrower. */
  readonly helpFor?: Partial<Record<CommandName, string>>;
}

const SERVE: CommandName[] = ["serve"];
const SERVERS: CommandName[] = ["serve", "router"];
const ENGINE: CommandName[] = ["serve", "generate"];
const STAGE: CommandName[] = ["stage"];

/** --max-keep-alive when not given: a day, or --keep-alive where that is longer. */
export const DEFAULT_MAX_KEEP_ALIVE_MS = 24 * 3_600_000;

const origin = z.string().regex(
  /^(\*|null|[a-z][a-z0-9+.-]*:\/\/[^/\s]+)$/i,
  "an origin is scheme://host[:port] (globs with * allowed, e.g. http://localhost:*), " +
    "'null', or '*'",
);
const apiKey = z.string().min(8, "API keys must have at least 8 characters").regex(
  /^[\x21-\x7e]+$/,
  "API keys must be printable ASCII without spaces (a key with a space can never match " +
    "'Authorization: Bearer <key>')",
);

export const SETTINGS = {
  // ── the model
  model: {
    group: "Model",
    help: "model path, https:// URL or known name",
    commands: [...ENGINE, "plan", ...STAGE],
    schema: text(),
    default: DEFAULT_MODEL,
    aliases: ["m"],
    env: "LLMSERVE_MODEL",
    repeatsInto: "models",
    helpFor: {
      plan: `a GGUF file (its header only is read) or a shape: ${PLAN_SHAPE_NAMES.join(", ")}`,
    },
  },
  tokenizer: {
    group: "Model",
    help: "llama2.c tokenizer.bin for a .bin checkpoint",
    commands: ENGINE,
    schema: text().optional(),
    env: "LLMSERVE_TOKENIZER",
  },
  modelsDir: {
    group: "Model",
    help: "where downloaded models are kept",
    commands: ["serve", "generate", "models"],
    schema: text().optional(),
    env: "MODELS_DIR",
  },
  contextLength: {
    group: "Model",
    help: "override the model's context length",
    commands: [...ENGINE, ...STAGE],
    schema: positiveInt().optional(),
    aliases: ["c", "ctx-size", "max-model-len"],
    env: "LLMSERVE_CONTEXT_LENGTH",
    perModel: true,
  },
  chatTemplate: {
    group: "Model",
    help: "Jinja chat template file used instead of the model's",
    commands: SERVE,
    schema: text().optional(),
    env: "LLMSERVE_CHAT_TEMPLATE",
  },
  servedModelName: {
    group: "Model",
    help: "name clients may give as `model` (repeatable; env: comma-separated)",
    commands: SERVE,
    kind: "list",
    schema: z.array(z.string().min(1, "a served model name cannot be empty")),
    env: "LLMSERVE_SERVED_MODEL_NAMES",
  },
  // ── several models in one server
  models: {
    group: "Several models",
    help:
      "several models served at once, loaded on demand (--model repeated; env: comma-separated)",
    commands: SERVE,
    noFlag: true,
    kind: "list",
    schema: z.array(z.string().min(1, "a model cannot be empty")),
    env: "LLMSERVE_MODELS",
  },
  modelsConfig: {
    group: "Several models",
    help:
      "a YAML or JSON file of models to serve, each with its own context-length, kv-memory, kv-dtype, keep-alive, aliases and sampling defaults",
    commands: SERVE,
    schema: text().optional(),
    env: "LLMSERVE_MODELS_CONFIG",
  },
  allModels: {
    group: "Several models",
    help: "serve every GGUF file of the models directory, by the names `deno task models` prints",
    commands: SERVE,
    kind: "switch",
    schema: toggle(),
    default: false,
    env: "LLMSERVE_ALL_MODELS",
  },
  memoryBudget: {
    group: "Several models",
    help:
      "memory all loaded models may hold together (weights + KV); the least recently used idle one is unloaded to make room (auto: the free memory at start)",
    commands: [...SERVE, ...STAGE],
    schema: byteSizeOrAuto(),
    default: "auto",
    env: "LLMSERVE_MEMORY_BUDGET",
    helpFor: {
      stage:
        "the most this stage's weights and KV cache may take; an attach past it is refused (auto: no limit)",
    },
  },
  maxLoadedModels: {
    group: "Several models",
    help: "models loaded at once at most (several models only; default no limit)",
    commands: SERVE,
    schema: positiveInt().optional(),
    env: "LLMSERVE_MAX_LOADED_MODELS",
  },
  keepAlive: {
    group: "Several models",
    help:
      "how long an idle model stays loaded: 30s, 5m, 1h, 0 (unload when idle), -1 (forever); a request's keep_alive overrides it",
    commands: SERVE,
    schema: duration(),
    default: "5m",
    env: "LLMSERVE_KEEP_ALIVE",
    perModel: true,
  },
  maxKeepAlive: {
    group: "Several models",
    help:
      `the longest keep_alive a request may ask (longer ones are lowered to it); -1 lets requests keep models forever (default ${
        formatKeepAlive(DEFAULT_MAX_KEEP_ALIVE_MS)
      }, or --keep-alive if longer)`,
    commands: SERVE,
    schema: duration().optional(),
    env: "LLMSERVE_MAX_KEEP_ALIVE",
  },
  // ── the engine
  backend: {
    group: "Engine",
    help: `${BACKENDS.join(" | ")} (auto times a decode step on cpu and webgpu, keeps the faster)`,
    commands: ENGINE,
    schema: z.enum(BACKENDS),
    default: "auto",
    env: "LLMSERVE_BACKEND",
  },
  threads: {
    group: "Engine",
    help: "CPU engine threads (default: the machine's cores)",
    commands: [...ENGINE, ...STAGE],
    schema: positiveInt(256).optional(),
    aliases: ["t"],
    env: "LLMSERVE_THREADS",
  },
  pooling: {
    group: "Engine",
    help:
      "how /v1/embeddings pools a sequence's hidden states: mean | cls | last (default: the GGUF's pooling_type, else mean)",
    commands: SERVE,
    schema: z.enum(POOLINGS as [Pooling, ...Pooling[]]).optional(),
    env: "LLMSERVE_POOLING",
    perModel: true,
  },
  rerankPrompt: {
    group: "Engine",
    help:
      "the prompt /v1/rerank asks a decoder reranker in, with {query} and {document} places (and {instruction}, filled with the request's); default: the GGUF's tokenizer.chat_template.rerank, else Qwen3-Reranker's",
    commands: SERVE,
    schema: text().refine((t) => rerankPromptProblem(t) === undefined, {
      error: (i) =>
        `must have {query} and {document} places: ${rerankPromptProblem(String(i.input))}`,
    }).optional(),
    env: "LLMSERVE_RERANK_PROMPT",
  },
  embdNormalize: {
    group: "Engine",
    help:
      "how embeddings are normalized, llama-server's values: -1 none, 0 max-abs to int16, 1 taxicab, 2 Euclidean, >2 p-norm",
    commands: SERVE,
    schema: intIn(-1, 1000),
    default: DEFAULT_EMBD_NORMALIZE,
    env: "LLMSERVE_EMBD_NORMALIZE",
  },
  kvDtype: {
    group: "Engine",
    help: "KV cache elements of the cpu and webgpu engines: f16 | f32 (default f16)",
    commands: [...ENGINE, "plan"],
    schema: z.enum(["f16", "f32"]).optional(),
    env: "LLMSERVE_KV_DTYPE",
    perModel: true,
  },
  kvMemory: {
    group: "Engine",
    help:
      "memory for the paged KV cache (auto: a full context per running sequence, within the device's limits)",
    commands: SERVE,
    schema: byteSizeOrAuto(),
    default: DEFAULT_LIMITS.kvMemory,
    env: "LLMSERVE_KV_MEMORY",
    perModel: true,
  },
  blockSize: {
    group: "Engine",
    help: "tokens per KV block",
    commands: SERVE,
    schema: positiveInt(),
    default: DEFAULT_LIMITS.blockSize,
    env: "LLMSERVE_BLOCK_SIZE",
  },
  pipelineDepth: {
    group: "Engine",
    help:
      `steps submitted ahead of their results (1-${DEFAULT_LIMITS.maxPipelineDepth}; default ${DEFAULT_LIMITS.pipelineDepth}; on webgpu ${DEFAULT_LIMITS.pipelineDepth}-${DEFAULT_LIMITS.readbackPipelineDepth}, adapted to the step's cost)`,
    commands: SERVE,
    schema: positiveInt(DEFAULT_LIMITS.maxPipelineDepth).optional(),
    env: "LLMSERVE_PIPELINE_DEPTH",
  },
  // ── the scheduler
  maxBatchTokens: {
    group: "Scheduler",
    help: "tokens computed per step at most",
    commands: SERVE,
    schema: positiveInt(),
    default: SCHEDULER_DEFAULTS.maxBatchTokens,
    env: "LLMSERVE_MAX_BATCH_TOKENS",
  },
  maxRunning: {
    group: "Scheduler",
    help: "sequences in one step at most",
    commands: SERVE,
    schema: positiveInt(),
    default: SCHEDULER_DEFAULTS.maxRunning,
    // llama-server's slots are our running sequences: at most that many in one step.
    aliases: ["parallel", "np"],
    env: "LLMSERVE_MAX_RUNNING",
  },
  maxWaiting: {
    group: "Scheduler",
    help: "queued requests that cannot start yet before answering overloaded",
    commands: SERVE,
    schema: positiveInt(),
    default: SCHEDULER_DEFAULTS.maxWaiting,
    env: "LLMSERVE_MAX_WAITING",
  },
  // ── the HTTP listener
  host: {
    group: "HTTP listener",
    help: "address to listen on",
    commands: SERVERS,
    schema: text(),
    default: "127.0.0.1",
    env: "LLMSERVE_HOST",
    helpFor: { router: "address the router listens on" },
  },
  port: {
    group: "HTTP listener",
    help: "port to listen on (0 picks a free one)",
    commands: ["serve", "router", "cluster"],
    schema: port(),
    default: 8000,
    env: "LLMSERVE_PORT",
    helpFor: {
      router: "port the router listens on (0 picks a free one)",
      cluster: "port the cluster's router listens on",
    },
  },
  maxConnections: {
    group: "HTTP listener",
    help: "open client connections at most (default: from the open-file limit)",
    commands: SERVERS,
    schema: positiveInt().optional(),
    env: "LLMSERVE_MAX_CONNECTIONS",
  },
  headerTimeout: {
    group: "HTTP listener",
    help: "seconds a connection has to send a request's headers",
    commands: SERVERS,
    schema: seconds(),
    default: HTTP_DEFAULTS.headerTimeoutSeconds,
    env: "LLMSERVE_HEADER_TIMEOUT",
  },
  bodyTimeout: {
    group: "HTTP listener",
    help: "seconds a whole request may take to arrive",
    commands: SERVERS,
    schema: seconds(),
    default: HTTP_DEFAULTS.bodyTimeoutSeconds,
    env: "LLMSERVE_BODY_TIMEOUT",
  },
  keepAliveTimeout: {
    group: "HTTP listener",
    help: "seconds an idle keep-alive connection is kept",
    commands: SERVERS,
    schema: seconds(),
    default: HTTP_DEFAULTS.keepAliveTimeoutSeconds,
    env: "LLMSERVE_KEEP_ALIVE_TIMEOUT",
  },
  drainTimeout: {
    group: "HTTP listener",
    help:
      `seconds to let in-flight requests finish on SIGTERM; the process exits at most ${EXIT_GRACE_SECONDS} s after it`,
    commands: SERVERS,
    schema: secondsOrZero(),
    default: HTTP_DEFAULTS.drainTimeoutSeconds,
    env: "LLMSERVE_DRAIN_TIMEOUT",
  },
  // ── who may call it
  apiKey: {
    group: "Security",
    help: "accepted API keys (env: comma-separated)",
    commands: SERVERS,
    kind: "list",
    schema: z.array(apiKey),
    env: "LLMSERVE_API_KEYS",
  },
  metricsPublic: {
    group: "Security",
    help: "serve /metrics without an API key",
    commands: SERVE,
    kind: "switch",
    schema: toggle(),
    default: false,
    env: "LLMSERVE_METRICS_PUBLIC",
  },
  corsOrigin: {
    group: "Security",
    help:
      "origin whose pages may use the API, e.g. http://localhost:* (repeatable; env: comma-separated)",
    commands: SERVE,
    kind: "list",
    schema: z.array(origin),
    env: "LLMSERVE_CORS_ORIGINS",
  },
  allowedHost: {
    group: "Security",
    help: "host name served besides IPs and localhost (repeatable; env: comma-separated)",
    commands: SERVE,
    kind: "list",
    schema: z.array(
      z.string().regex(/^[a-z0-9.-]+$/i, "a host name is letters, digits, dots and dashes"),
    ),
    env: "LLMSERVE_ALLOWED_HOSTS",
  },
  // ── caches
  cacheScope: {
    group: "Caches",
    help: "who shares the result and prefix caches: key (each API key its own) | global",
    commands: SERVERS,
    schema: z.enum(["key", "global"]),
    default: "key",
    env: "LLMSERVE_CACHE_SCOPE",
  },
  resultCache: {
    group: "Caches",
    // Off by default: benchmarks and soak runs repeat requests to measure the engine, and a
    // cache would answer them instead.
    help: "memory for cached answers to deterministic requests, e.g. 64MiB (0: off)",
    commands: SERVE,
    schema: byteSize(),
    default: "0",
    env: "LLMSERVE_RESULT_CACHE",
  },
  sharedCacheTtl: {
    group: "Caches",
    help:
      "with --nats and --result-cache: how long an entry of the replicas' shared result cache (NATS JetStream key-value) lives, e.g. 1h",
    commands: SERVE,
    schema: duration().refine((ms) => ms > 0, "must be a positive duration, e.g. 1h"),
    default: CLUSTER_DEFAULTS.sharedCacheTtl,
    env: "LLMSERVE_SHARED_CACHE_TTL",
  },
  sharedCacheSecret: {
    group: "Caches",
    help:
      "with --nats and --result-cache: the replicas' common secret that names and encrypts the shared result cache's entries (give it by the variable: a command line is public); without it the cache stays in-process",
    commands: SERVE,
    schema: z.string().min(16, "must be at least 16 characters").optional(),
    env: "LLMSERVE_SHARED_CACHE_SECRET",
  },
  similarCache: {
    group: "Caches",
    help:
      "answer a deterministic chat question with the stored answer of one whose embedding is at least this similar (cosine, e.g. 0.95), asked in the same context; off without it, needs --result-cache",
    commands: SERVE,
    schema: numberIn(0, 1, true).optional(),
    env: "LLMSERVE_SIMILAR_CACHE",
  },
  similarCacheModel: {
    group: "Caches",
    help:
      "with --similar-cache: embed the questions with this model (path, https:// URL or known name; an embedding model such as Qwen3-Embedding, run on the CPU engine beside the served one) instead of the served model's own pooled hidden states",
    commands: SERVE,
    schema: text().optional(),
    env: "LLMSERVE_SIMILAR_CACHE_MODEL",
  },
  similarCacheMemory: {
    group: "Caches",
    help: "memory for the similar-question index (vectors, questions, keys)",
    commands: SERVE,
    schema: byteSize(),
    default: "16MiB",
    env: "LLMSERVE_SIMILAR_CACHE_MEMORY",
  },
  grammarPreload: {
    group: "Caches",
    help:
      "start the structured-output engine (XGrammar over the vocabulary) once the server is ready, so the first response_format request does not wait for it (~100 MiB on a 150k vocabulary); false: start it on the first such request",
    commands: SERVE,
    kind: "switch",
    schema: toggle(),
    default: true,
    env: "LLMSERVE_GRAMMAR_PRELOAD",
  },
  grammarCompileTimeout: {
    group: "Caches",
    help:
      "how long one structured-output grammar (a schema, a tool's parameters, a GBNF) may compile before the request is refused with a 400 naming the budget; raise it on a slow or busy machine",
    commands: SERVE,
    schema: duration().refine((ms) => ms > 0, "must be a positive duration, e.g. 10s"),
    default: formatKeepAlive(GRAMMAR_LIMITS.compileMs),
    env: "LLMSERVE_GRAMMAR_COMPILE_TIMEOUT",
  },
  // ── logs
  logFormat: {
    group: "Logs",
    help: "request log lines: text | json | off",
    commands: SERVE,
    schema: z.enum(["text", "json", "off"]),
    default: "text",
    env: "LLMSERVE_LOG_FORMAT",
  },
  logLevel: {
    group: "Logs",
    help: `${LOG_LEVELS.join(" | ")} (debug adds health/ready/metrics probes)`,
    commands: SERVE,
    schema: z.enum(LOG_LEVELS),
    default: "info",
    env: "LLMSERVE_LOG_LEVEL",
  },
  logProbes: {
    group: "Logs",
    help: "log successful /health, /ready and /metrics requests too",
    commands: SERVE,
    kind: "switch",
    schema: toggle(),
    default: false,
    env: "LLMSERVE_LOG_PROBES",
  },
  // ── the cluster
  nats: {
    group: "Cluster",
    help: "NATS server(s) to also serve as a replica on: nats://[user:pass@|token@]host:port",
    commands: [...SERVERS, ...STAGE],
    schema: text().optional(),
    env: "LLMSERVE_NATS",
    helpFor: {
      router:
        "NATS server(s) the replicas serve on: nats://[user:pass@|token@]host:port (required)",
      stage: "NATS server(s) the head and its stages meet on: nats://[user:pass@|token@]host:port",
    },
  },
  pipelineParallelSize: {
    group: "Cluster",
    help:
      "pipeline stages the model's layers are split over (vLLM's name); this server runs the first, and starts the others on this machine unless --nats is given, where it attaches to `deno task stage` processes",
    commands: SERVE,
    schema: positiveInt(64),
    default: 1,
    aliases: ["pp"],
    env: "LLMSERVE_PIPELINE_PARALLEL_SIZE",
  },
  tensorParallelSize: {
    group: "Cluster",
    help:
      "tensor-parallel ranks every layer's matrices are split over by rows (vLLM's name), bit-identical to one process; this server is rank 0 and starts the others on this machine unless --nats is given, where it attaches to `deno task stage --tp-rank r/n` processes (not yet with --pipeline-parallel-size)",
    commands: SERVE,
    schema: positiveInt(256),
    default: 1,
    aliases: ["tp"],
    env: "LLMSERVE_TENSOR_PARALLEL_SIZE",
  },
  pipelineMicroBatches: {
    group: "Cluster",
    help:
      "groups a pipeline step's sequences go down the stages in, one behind another, so all stages work at once (default: the stage count; 1: the whole step at once)",
    commands: SERVE,
    schema: positiveInt(256).optional(),
    env: "LLMSERVE_PIPELINE_MICRO_BATCHES",
  },
  layers: {
    group: "Cluster",
    help: "the layers a pipeline stage runs, start-end (end excluded), e.g. 0-16",
    commands: STAGE,
    schema: z.string().regex(/^\d+-\d+$/, "expected start-end, e.g. 0-16").optional(),
  },
  tpRank: {
    group: "Cluster",
    help:
      "serve as tensor-parallel rank r of n (r/n, r from 1; the head is rank 0) instead of a layer range: every layer, the rank's rows of each matrix",
    commands: STAGE,
    schema: z.string().regex(/^\d+\/\d+$/, "expected rank/size, e.g. 1/2").optional(),
  },
  stageHost: {
    group: "Cluster",
    help: "the address a pipeline stage's link listens on and announces (default 127.0.0.1)",
    commands: STAGE,
    schema: text(),
    default: "127.0.0.1",
    env: "LLMSERVE_STAGE_HOST",
  },
  natsCreds: {
    group: "Cluster",
    help: "NATS .creds file (JWT + NKey seed)",
    commands: [...SERVERS, ...STAGE],
    schema: text().optional(),
    env: "LLMSERVE_NATS_CREDS",
  },
  routing: {
    group: "Cluster",
    help: `router: ${ROUTING_POLICIES.join(" | ")}`,
    commands: ["router"],
    schema: z.enum(ROUTING_POLICIES),
    default: CLUSTER_DEFAULTS.routing,
    env: "LLMSERVE_ROUTING",
  },
  byModel: {
    group: "Cluster",
    help:
      "router: replicas may serve different models; each request goes to one serving its `model`",
    commands: ["router"],
    kind: "switch",
    schema: toggle(),
    default: false,
    env: "LLMSERVE_BY_MODEL",
  },
  replicas: {
    group: "Cluster",
    help: "replicas the local cluster starts",
    commands: ["cluster"],
    schema: positiveInt(),
    default: CLUSTER_DEFAULTS.localReplicas,
  },
  natsPort: {
    group: "Cluster",
    help: "port of the local cluster's nats-server (on 127.0.0.1)",
    commands: ["cluster"],
    schema: port(),
    default: CLUSTER_DEFAULTS.localNatsPort,
  },
  // ── the Batch API: a server's and a router's alike (both keep files and batches)
  dataDir: {
    group: "Batch API",
    help:
      "where batch files and results live (default $XDG_DATA_HOME/llmserve, else ~/.local/share/llmserve)",
    commands: SERVERS,
    schema: text().optional(),
    env: "LLMSERVE_DATA_DIR",
  },
  batchConcurrency: {
    group: "Batch API",
    help: "batch lines generating at once, beside interactive traffic",
    commands: SERVERS,
    schema: positiveInt(),
    default: 4,
    env: "LLMSERVE_BATCH_CONCURRENCY",
  },
  batchMaxFileSize: {
    group: "Batch API",
    help: "largest batch input file",
    commands: SERVERS,
    schema: byteSize(),
    default: "100MiB",
    env: "LLMSERVE_BATCH_MAX_FILE_SIZE",
  },
  batchMaxLines: {
    group: "Batch API",
    help: "most request lines in one batch input file",
    commands: SERVERS,
    schema: positiveInt(),
    default: 50000,
    env: "LLMSERVE_BATCH_MAX_LINES",
  },
  batchMaxActive: {
    group: "Batch API",
    help: "most unfinished batches at once",
    commands: SERVERS,
    schema: positiveInt(),
    default: 16,
    env: "LLMSERVE_BATCH_MAX_ACTIVE",
  },
  batchMaxUploads: {
    group: "Batch API",
    help: "file uploads streaming at once over the server (more get 429 with Retry-After)",
    commands: SERVERS,
    schema: positiveInt(),
    default: 8,
    env: "LLMSERVE_BATCH_MAX_UPLOADS",
  },
  batchMaxUploadsPerKey: {
    group: "Batch API",
    help: "file uploads streaming at once for one API key (more get 429 with Retry-After)",
    commands: SERVERS,
    schema: positiveInt(),
    default: 2,
    env: "LLMSERVE_BATCH_MAX_UPLOADS_PER_KEY",
  },
  batchMaxStorage: {
    group: "Batch API",
    help:
      "bytes of files (inputs and outputs) one API key may keep; without keys, the whole data dir",
    commands: SERVERS,
    schema: byteSize(),
    default: "10GiB",
    env: "LLMSERVE_BATCH_MAX_STORAGE",
  },
  batchMaxFiles: {
    group: "Batch API",
    help: "files (inputs and outputs) one API key may keep; without keys, the whole data dir",
    commands: SERVERS,
    schema: positiveInt(),
    default: 1000,
    env: "LLMSERVE_BATCH_MAX_FILES",
  },
  batchRetention: {
    group: "Batch API",
    help:
      "how long a finished batch's input, output and error files are kept, e.g. 24h (-1: until deleted)",
    commands: SERVERS,
    schema: duration(),
    default: "720h",
    env: "LLMSERVE_BATCH_RETENTION",
  },
  // ── one generation (`generate`); a request's limits are the HTTP layer's parameter table's
  prompt: {
    group: "Generation",
    help: "the text to continue",
    commands: ["generate"],
    schema: z.string(),
    default: "",
    aliases: ["p"],
  },
  maxTokens: {
    group: "Generation",
    help: "tokens generated at most (lowered to what the context leaves)",
    commands: ["generate"],
    schema: flagNumber("max_tokens"),
    default: 256,
    aliases: ["n", "n-predict"],
  },
  temperature: {
    group: "Generation",
    help: "sampling temperature (0: greedy)",
    commands: ["generate"],
    schema: flagNumber("temperature"),
    default: numberDefault("temperature"),
    aliases: ["temp"],
  },
  topK: {
    group: "Generation",
    help: "sample among the k likeliest tokens (0: all)",
    commands: ["generate"],
    schema: flagNumber("top_k"),
    default: numberDefault("top_k"),
  },
  topP: {
    group: "Generation",
    help: "nucleus sampling: the likeliest tokens holding this much probability",
    commands: ["generate"],
    schema: flagNumber("top_p"),
    default: numberDefault("top_p"),
  },
  minP: {
    group: "Generation",
    help: "drop tokens below this share of the likeliest one's probability",
    commands: ["generate"],
    schema: flagNumber("min_p"),
    default: numberDefault("min_p"),
  },
  seed: {
    group: "Generation",
    help: "sampling seed (default: random)",
    commands: ["generate"],
    // Any request seed, mapped to the engine's 32 bits as the server maps it.
    schema: flagNumber("seed").optional(),
  },
  // ── the planner (`plan`): layouts of a model over hosts, predicted (lib/cluster/plan_*.ts)
  hosts: {
    group: "Planner",
    help:
      "the hosts: [COUNTx]MEMORY[@THREADSthr][*SPEED] groups, comma-separated (e.g. 4x16GiB@1thr; SPEED: one thread against this machine's), or a hosts file (.json)",
    commands: ["plan"],
    schema: text().optional(),
  },
  bandwidth: {
    group: "Planner",
    help:
      "the link between two hosts, e.g. 1Gbit/s, 100Mb/s, 1.2GB/s, loopback (a hosts file's link wins)",
    commands: ["plan"],
    schema: parsed(parseBandwidth),
    default: "1Gbit/s",
  },
  latency: {
    group: "Planner",
    help: "one hop's latency between two hosts, e.g. 0.2ms, 50ms (a hosts file's link wins)",
    commands: ["plan"],
    schema: parsed(parseLatency),
    default: "0.2ms",
  },
  sequences: {
    group: "Planner",
    help: "the concurrent sequences of the throughput column, shared out over replicas",
    commands: ["plan"],
    schema: positiveInt(4096),
    default: 32,
  },
  context: {
    group: "Planner",
    help: "positions each sequence keeps in the KV cache and attends to while decoding",
    commands: ["plan"],
    schema: positiveInt(1 << 20),
    default: 2048,
  },
  promptTokens: {
    group: "Planner",
    help: "the prompt of the time-to-first-token column, in tokens",
    commands: ["plan"],
    schema: positiveInt(1 << 20),
    default: 512,
  },
  processOverhead: {
    group: "Planner",
    help: "memory each process needs besides weights and KV cache (runtime, activations)",
    commands: ["plan"],
    schema: byteSize(),
    default: "256MiB",
  },
  headStage: {
    group: "Planner",
    help:
      "the stage whose process the head (scheduler, sampler) shares: first (the last stage sends it the logits) | last (it sends the first stage the plan)",
    commands: ["plan"],
    schema: z.enum(HEAD_PLACES as [HeadPlace, ...HeadPlace[]]),
    default: "first",
  },
  rankBy: {
    group: "Planner",
    help: `what best means: ${RANK_BY.join(" | ")} (tok/s at --sequences, at 1, first token)`,
    commands: ["plan"],
    schema: z.enum(RANK_BY as [RankBy, ...RankBy[]]),
    default: "throughput",
  },
  top: {
    group: "Planner",
    help: "layouts printed of those that fit (and as many that do not)",
    commands: ["plan"],
    schema: positiveInt(),
    default: 10,
  },
  calibration: {
    group: "Planner",
    help:
      `the cost model's calibration file (default: the one shipped, lib/cluster/plan_calibration.json); --calibrate writes it (default there: ${CALIBRATION_OUT})`,
    commands: ["plan"],
    schema: text().optional(),
  },
  calibrate: {
    group: "Planner",
    help:
      "time one thread of the CPU engine on --model (a GGUF file) and loopback NATS, write --calibration, then plan",
    commands: ["plan"],
    kind: "switch",
    schema: toggle(),
    default: false,
    aliases: ["measure"],
  },
} as const satisfies Record<string, SettingRow>;

export type SettingName = keyof typeof SETTINGS;

/** The validated value of every setting. */
export type Settings = { -readonly [K in SettingName]: z.output<(typeof SETTINGS)[K]["schema"]> };

/** The settings a `--models-config` model entry may set: the rows marked `perModel`. */
export type PerModelSetting = {
  [K in SettingName]: (typeof SETTINGS)[K] extends { perModel: true } ? K : never;
}[SettingName];

/** The row of a setting, as the parser and the help see every row. */
export function row(name: SettingName): SettingRow {
  return SETTINGS[name];
}

/** Every setting's name, in the table's order. */
export const SETTING_NAMES = Object.keys(SETTINGS) as SettingName[];

/** `maxBatchTokens` -> `max-batch-tokens`: a setting's flag, without its dashes. */
export function flagOf(name: string): string {
  return name.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase());
}

/**
 * Flags that llama-server, vLLM and Ollama users type which have no equivalent here, with what
 * does that job instead. They take a value, so `-ngl 99` is read as one flag, not `-n -g -l`.
 * When one of them gets an equivalent, it becomes a row of SETTINGS.
 */
export const PEER_FLAGS: Readonly<
  Record<string, { readonly aliases?: readonly string[]; readonly instead: string }>
> = {
  "n-gpu-layers": {
    aliases: ["ngl"],
    instead: `the backend is chosen with --backend (${
      BACKENDS.join(", ")
    }), and every layer runs on it`,
  },
  "gpu-memory-utilization": {
    instead:
      "the KV cache is sized with --kv-memory (a size such as 2GiB, or auto) and all models together with --memory-budget",
  },
};

/** The commands that answer a peer's flag with what to use instead (the others: unknown). */
export const PEER_FLAG_COMMANDS: readonly CommandName[] = ["serve", "generate"];

/** The peers' flags `command` answers with what to use instead, by flag (none for the rest). */
export function peerFlagsOf(command: CommandName): [string, (typeof PEER_FLAGS)[string]][] {
  return PEER_FLAG_COMMANDS.includes(command) ? Object.entries(PEER_FLAGS) : [];
}

/**
 * The flag a setting is given by: its own, or the one whose repeats fill it (`repeated`);
 * undefined for a setting read from its variable only.
 */
export function givingFlag(name: SettingName): { flag: string; repeated: boolean } | undefined {
  if (!row(name).noFlag) return { flag: `--${flagOf(name)}`, repeated: false };
  const by = SETTING_NAMES.find((n) => row(n).repeatsInto === name);
  return by === undefined ? undefined : { flag: `--${flagOf(by)}`, repeated: true };
}
