/**
 * `deno task start --model a --model b` (or `--all-models`): one server, several models. None
 * is loaded at start; the pool (lib/compose/model_pool.ts) loads each on its first request and
 * unloads idle ones under --memory-budget, --max-loaded-models and the keep-alive.
 */
import type { KvPlan } from "../engine/kv_budget.ts";
import { grammarPendingNote, startGrammarInBackground } from "../compose/grammar_preload.ts";
import { SpanStatusCode, trace } from "@opentelemetry/api";
import { createApp, type ServiceApp } from "../http/app.ts";
import { serveService } from "../http/serve.ts";
import { ServiceMetrics } from "../http/service_metrics.ts";
import { RequestLog } from "../http/request_log.ts";
import { describeModelFile } from "../model/model_info.ts";
import { listLocalModelFiles, modelStem, resolveModelSource } from "../source/model_source.ts";
import {
  describeChoice,
  engineMemory,
  modelAllocator,
  modelPlacement,
  resolveBackend,
  type ResolvedBackend,
} from "../compose/engine_factory.ts";
import { openServing, planServing } from "../compose/open_serving.ts";
import { modelAppOptions, servedBackend, servingSettings } from "./serving_settings.ts";
import { sharedResultStore } from "./shared_cache_config.ts";
import type { NatsResultStore } from "../cluster/nats_result_store.ts";
import { type LoadContext, ModelPool } from "../compose/model_pool.ts";
import { owningHeap } from "../../kernels/wasm/heap.ts";
import { createModelsFront } from "../http/models_front.ts";
import type {
  CatalogModel,
  ModelDirectory,
  PooledModel,
  Residue,
} from "../http/model_directory.ts";
import { formatBytes } from "../util/byte_size.ts";
import { formatKeepAlive } from "../util/duration.ts";
import { openFileLimit } from "../util/fd_limit.ts";
import { listenerOptions } from "./listener_options.ts";
import { describeWithGpuApi } from "../util/gpu_api.ts";
import { type Config, maxKeepAlive } from "./config.ts";
import { openModel } from "./open_model.ts";
import type { ReplicaModels, ReplicaSource } from "../cluster/replica.ts";
import { identityOrWarning } from "../cluster/model_identity.ts";
import { coreReplicaSource } from "../cluster/replica_source.ts";
import { openSimilarCacheModel, type SimilarCacheModel } from "./similar_cache_model.ts";
import { drainedLine } from "./serve_lines.ts";
import { stopOnRequest } from "./stop_deadline.ts";
import { connectReplica, startReplicaAgent } from "./replica_role.ts";
import { type ModelsFileEntry, readModelsConfig } from "./models_config.ts";
import { batchQueueFor } from "./batch_queue_config.ts";

/** A model file served by name, with what /v1/models says of it. */
type ServedFile = CatalogModel & {
  readonly path: string;
  readonly bytes: number;
  readonly format: string;
  /** Its own settings and sampling defaults (its entry in --models-config). */
  readonly own?: Pick<ModelsFileEntry, "settings" | "sampling">;
};

/** The configuration one model runs with: the server's, with its own settings over it. */
function configOf(m: ServedFile, config: Config): Config {
  return m.own === undefined ? config : { ...config, ...m.own.settings };
}

/** The model files a configuration serves, by name, with what /v1/models says of them. */
export async function modelCatalog(config: Config): Promise<ServedFile[]> {
  const paths: string[] = [];
  if (config.allModels) {
    const { files } = await listLocalModelFiles({ modelsDir: config.modelsDir });
    // The models directory's GGUF files: a llama2.c checkpoint needs a tokenizer of its own.
    for (const f of files) {
      if (f.place === "models dir" && f.kind === "model" && f.name.endsWith(".gguf")) {
        paths.push(f.path);
      }
    }
  }
  for (const spec of config.models) {
    const source = await resolveModelSource(spec, {
      modelsDir: config.modelsDir,
      tokenizer: config.tokenizer,
    });
    paths.push(source.modelPath);
  }
  const catalog: ServedFile[] = [];
  const fromFile = config.modelsConfig === undefined ? [] : readModelsConfig(config.modelsConfig);
  for (const path of paths) {
    const name = modelStem(path);
    if (catalog.some((m) => m.name === name)) {
      throw new Error(
        `Two models would be served as "${name}": ${catalog.find((m) => m.name === name)!.path} ` +
          `and ${path}; a model is named by its file's name without .gguf/.bin`,
      );
    }
    const info = await describeModelFile(path);
    catalog.push({
      name,
      path,
      bytes: (await Deno.stat(path)).size,
      format: info.format,
      ...(info.architecture === undefined ? {} : { architecture: info.architecture }),
      ...(info.quantization === undefined ? {} : { quantization: info.quantization }),
      ...(config.contextLength ?? info.contextLength) === undefined
        ? {}
        : { contextLength: config.contextLength ?? info.contextLength },
    });
  }
  const own: (ServedFile & { readonly aliases: readonly string[] })[] = [];
  for (const e of fromFile) {
    const source = await resolveModelSource(e.model, {
      modelsDir: config.modelsDir,
      tokenizer: config.tokenizer,
    });
    const path = source.modelPath;
    const info = await describeModelFile(path);
    const contextLength = e.settings.contextLength ?? config.contextLength ?? info.contextLength;
    own.push({
      name: e.name,
      aliases: e.aliases,
      path,
      bytes: (await Deno.stat(path)).size,
      format: info.format,
      ...(info.architecture === undefined ? {} : { architecture: info.architecture }),
      ...(info.quantization === undefined ? {} : { quantization: info.quantization }),
      ...(contextLength === undefined ? {} : { contextLength }),
      own: { settings: e.settings, ...(e.sampling ? { sampling: e.sampling } : {}) },
    });
  }
  if (catalog.length === 0 && own.length === 0) {
    throw new Error(
      config.allModels
        ? `--all-models: the models directory has no .gguf files (${config.modelsDir ?? "default"})`
        : "No model to serve",
    );
  }
  return uniqueNames([...withServedNames(catalog, config.servedModelName), ...own]);
}

/** The catalog, refused when two of its models would answer to one name. */
function uniqueNames<M extends ServedFile & { readonly aliases?: readonly string[] }>(
  all: readonly M[],
): M[] {
  const owner = new Map<string, string>();
  for (const m of all) {
    for (const name of [m.name, ...(m.aliases ?? [])]) {
      const other = owner.get(name);
      if (other !== undefined) {
        throw new Error(
          `Two models would be served as ${JSON.stringify(name)}: ${other} and ${m.path} ` +
            "(--model, --served-model-name and --models-config name them together)",
        );
      }
      owner.set(name, m.path);
    }
  }
  return [...all];
}

/**
 * `--served-model-name alias=model` (repeatable) in a server of several models: the model
 * (by its file's name) is served as the alias instead, and as every further alias given for
 * it; the first is its name in /v1/models, /health, /metrics and to routers. Every entry must
 * say which model it is for, name a model served, and no name may be served twice.
 */
export function withServedNames<M extends CatalogModel>(
  catalog: readonly M[],
  entries: readonly string[],
): (M & { readonly aliases?: readonly string[] })[] {
  const byFile = new Map<string, string[]>();
  for (const entry of entries) {
    const at = entry.indexOf("=");
    if (at < 0) {
      throw new Error(
        `--served-model-name: with several models each name says which model it is for, as ` +
          `alias=model (model: one of ${catalog.map((m) => `"${m.name}"`).join(", ")}); ` +
          `received ${JSON.stringify(entry)}`,
      );
    }
    const alias = entry.slice(0, at).trim(), file = entry.slice(at + 1).trim();
    if (alias === "") {
      throw new Error(
        `--served-model-name: the alias before "=" is empty in ${JSON.stringify(entry)}`,
      );
    }
    if (!catalog.some((m) => m.name === file)) {
      throw new Error(
        `--served-model-name ${JSON.stringify(entry)}: no model is named ${
          JSON.stringify(file)
        }; ` +
          `the models are ${catalog.map((m) => `"${m.name}"`).join(", ")} (their files' names)`,
      );
    }
    const names = byFile.get(file) ?? [];
    if (!names.includes(alias)) names.push(alias);
    byFile.set(file, names);
  }
  const out = catalog.map((m) => {
    const names = byFile.get(m.name);
    return names === undefined ? m : { ...m, name: names[0]!, aliases: names.slice(1) };
  });
  const owner = new Map<string, string>();
  for (const [i, m] of out.entries()) {
    for (const name of [m.name, ...(m.aliases ?? [])]) {
      const other = owner.get(name);
      if (other !== undefined && other !== catalog[i]!.name) {
        throw new Error(
          `--served-model-name: two models would be served as ${JSON.stringify(name)}: ` +
            `"${other}" and "${catalog[i]!.name}"`,
        );
      }
      owner.set(name, catalog[i]!.name);
    }
  }
  return out;
}

/** The shared pieces every model's app is built with. */
interface Shared {
  readonly config: Config;
  readonly log: (line: string) => void;
  readonly chatTemplate?: string;
  readonly requestLog: RequestLog;
  readonly resolved: Promise<ResolvedBackend>;
  /** Each model's metrics registry, kept across its loads. */
  readonly metrics: ReadonlyMap<string, ServiceMetrics>;
  /** Parsed files (weights' bytes, tokenizer) by model: loaded, or left by an unload. */
  readonly parsed: Map<string, ParsedFile>;
  /**
   * With --nats: what the replica serves of each loaded model (set by its load, removed by its
   * unload), and each model's identity for routers.
   */
  readonly replicaSources?: Map<string, ReplicaSource>;
  readonly modelIds?: ReadonlyMap<string, string | undefined>;
  /** With --nats: the result cache's shared level, one for every model (keys name the model). */
  readonly resultStore?: NatsResultStore;
  /** --similar-cache-model, opened once: every model's cache for similar questions embeds with it. */
  readonly questions?: SimilarCacheModel;
}

/** A model file as openModel gives it, and how to free the bytes it was read into. */
interface ParsedFile {
  readonly opened: Awaited<ReturnType<typeof openModel>>;
  readonly free: () => void;
}

/**
 * Reads and parses a model file; its bytes go where the backend wants them (the CPU engine's
 * heap), and free() returns them there, which nothing else would: the heap is never collected.
 */
async function parseFile(m: ServedFile, server: Config, ctx: LoadContext): Promise<ParsedFile> {
  const config = configOf(m, server);
  const allocate = modelAllocator(config.backend);
  const place = modelPlacement(config.backend, config.kvMemory);
  const views: Uint8Array[] = [];
  const opened = await openModel(m.path, {
    modelsDir: config.modelsDir,
    tokenizer: config.tokenizer,
    contextLength: config.contextLength,
    purpose: "serve",
    onProgress: (_phase, bytes, total) => ctx.progress(bytes, total),
    ...(allocate === undefined ? {} : {
      allocate: (n: number) => {
        const view = allocate(n);
        views.push(view);
        return view;
      },
    }),
    ...(place === undefined ? {} : {
      placeTensors: (tensors: Parameters<typeof place>[0], header: Parameters<typeof place>[1]) => {
        const placed = place(tensors, header);
        if (placed) {
          for (const v of placed) if (v) views.push(v instanceof Uint8Array ? v : v.view);
        }
        return placed;
      },
    }),
  });
  let freed = false;
  return {
    opened,
    free: () => {
      if (freed) return;
      freed = true;
      for (const v of views) owningHeap(v)?.free(v.byteOffset, v.byteLength);
    },
  };
}

/**
 * Loads one model the way a one-model server does (open, plan the KV cache, build the engine,
 * warm it up, start its core) and wraps it in its own app. The KV plan is reserved in the pool
 * before the engine is built, so a model that cannot fit fails before taking the memory.
 */
export async function loadServedModel(
  m: ServedFile,
  shared: Shared,
  ctx: LoadContext,
): Promise<PooledModel<ServiceApp> & { readonly description: string; readonly reused: boolean }> {
  const { config } = shared;
  const reused = shared.parsed.get(m.name);
  const file = reused ?? await parseFile(m, config, ctx);
  shared.parsed.set(m.name, file);
  // The parsed file outlives this load only by coming back from close() as its residue.
  const residue = {
    bytes: m.bytes,
    drop: () => {
      if (shared.parsed.get(m.name) === file) shared.parsed.delete(m.name);
      file.free();
    },
  };
  try {
    return await buildOnFile(m, shared, ctx, file, reused !== undefined, residue);
  } catch (e) {
    residue.drop();
    throw e;
  }
}

async function buildOnFile(
  m: ServedFile,
  shared: Shared,
  ctx: LoadContext,
  file: ParsedFile,
  reused: boolean,
  residue: Residue,
): Promise<PooledModel<ServiceApp> & { readonly description: string; readonly reused: boolean }> {
  const config = configOf(m, shared.config);
  const { tokenizer, ...opened } = file.opened;
  const settings = servingSettings(config);
  const resolved = await shared.resolved;
  const { plan, kv, model } = await planServing(
    opened.model,
    resolved,
    settings.kvRequest,
    settings.engineOptions,
  );
  ctx.reserve(m.bytes + plan.bytes);
  const metrics = shared.metrics.get(m.name)!;
  const built = await openServing({
    ...settings.core,
    model,
    tokenizer,
    resolved,
    kv,
    warmUp: true,
    metrics,
  });
  const { core, description } = built;
  const template = shared.chatTemplate ?? model.chatTemplate;
  const { coreBackend, backend } = servedBackend(
    config,
    {
      name: m.name,
      core,
      tokenizer,
      model,
      ...(template ? { chatTemplate: template } : {}),
      ...(m.own?.sampling ? { sampling: m.own.sampling } : {}),
    },
    shared.resultStore,
    shared.questions?.embedder,
  );
  const service = createApp(modelAppOptions(config, {
    backend,
    metrics,
    servedModelNames: [m.name, ...(m.aliases ?? [])],
    requestLog: shared.requestLog,
    modelPath: m.path,
    description,
    kvBlocks: plan.numBlocks,
  }));
  shared.replicaSources?.set(
    m.name,
    {
      ...coreReplicaSource({
        backend: coreBackend,
        core,
        tokenizer: model.tokenizer!,
        blockSize: plan.blockSize,
        modelName: m.name,
        modelId: shared.modelIds?.get(m.name),
        limits: config,
      }),
      // Streams from routers take the result cache too (and its shared level).
      backend,
    },
  );
  const mem = engineMemory(built.engine);
  const grammars = built.grammarEngine;
  const preload = config.grammarPreload && grammars !== undefined;
  // After the pool's "loaded" line: the load and the request that asked for it never wait on it.
  if (preload) {
    setTimeout(() => startGrammarInBackground(grammars.start, shared.log, `model ${m.name}: `));
  }
  return {
    service,
    bytes: mem === undefined ? m.bytes + plan.bytes : mem.weights + mem.kvCache,
    description,
    reused,
    ...loadNote(reused, plan, grammars === undefined ? undefined : preload),
    busy: () => service.inFlight,
    close: async () => {
      shared.replicaSources?.delete(m.name);
      service.close();
      grammars?.close();
      await core.close();
      return residue;
    },
  };
}

/** What the load log says after "loaded in N s": a reused file, a context shortened to fit. */
function loadNote(
  reused: boolean,
  plan: KvPlan,
  grammarPreload: boolean | undefined,
): { note?: string } {
  const parts = [
    ...(reused ? ["reused its parsed file"] : []),
    ...(plan.why.includes("shortened") ? [`kv cache ${plan.why}`] : []),
    ...(grammarPreload === undefined ? [] : [grammarPendingNote(grammarPreload, false)]),
  ];
  return parts.length === 0 ? {} : { note: parts.join("; ") };
}

/**
 * A load in its own span, `llm.model.load`, under the HTTP span of the request that started it
 * (the requests that share the load wait on this one): the model, its file, what it holds, and
 * the error when it fails.
 */
function tracedLoad(m: ServedFile, shared: Shared, ctx: LoadContext) {
  return trace.getTracer("llmserve").startActiveSpan(
    "llm.model.load",
    {
      attributes: {
        "llm.model": m.name,
        "llm.model.path": m.path,
        "llm.model.file_bytes": m.bytes,
      },
    },
    async (span) => {
      try {
        const loaded = await loadServedModel(m, shared, ctx);
        span.setAttribute("llm.model.bytes", loaded.bytes);
        span.setAttribute("llm.model.reused_file", loaded.reused);
        return loaded;
      } catch (e) {
        const message = e instanceof Error ? e.message : String(e);
        span.setStatus({ code: SpanStatusCode.ERROR, message });
        span.setAttribute("error.type", e instanceof Error ? e.name : "Error");
        throw e;
      } finally {
        span.end();
      }
    },
  );
}

/** Free host memory, the default budget (as `auto` KV sizing reads it); unknown: no limit. */
function freeMemory(): number | undefined {
  try {
    return Deno.systemMemoryInfo().available;
  } catch {
    return undefined;
  }
}

export async function serveModelsCommand(
  config: Config,
  chatTemplate: string | undefined,
): Promise<number> {
  const log = (line: string) => console.error(line);
  const keepAliveCap = maxKeepAlive(config);
  const catalog = await modelCatalog(config);
  const requestLog = new RequestLog(config.logFormat, undefined, {
    level: config.logLevel,
    probes: config.logProbes,
  });
  // The front's own: each model's core exports its families under its label.
  const metrics = new ServiceMetrics({ core: "none" });
  const budget = config.memoryBudget ?? freeMemory() ?? Infinity;
  const resultStore = sharedResultStore(config, log);
  const questions = config.similarCacheModel !== undefined && config.similarCache !== undefined
    ? await openSimilarCacheModel(config, config.similarCacheModel)
    : undefined;
  const shared: Shared = {
    ...(questions === undefined ? {} : { questions }),
    config,
    log,
    chatTemplate,
    requestLog,
    resolved: resolveBackend(config.backend),
    metrics: new Map(catalog.map((m) => [m.name, new ServiceMetrics()])),
    parsed: new Map(),
    ...(config.nats === undefined ? {} : {
      replicaSources: new Map(),
      ...(resultStore === undefined ? {} : { resultStore }),
      // The context the catalog names (the file's, or --context-length), known before a load,
      // so that a model is one identity whether loaded or not.
      modelIds: new Map(
        await Promise.all(
          catalog.map(async (m) =>
            [m.name, await identityOrWarning(m.path, m.contextLength ?? 0, log)] as const
          ),
        ),
      ),
    }),
  };
  const pool = new ModelPool<ServiceApp>(
    catalog.map((m) => ({
      name: m.name,
      estimateBytes: m.bytes,
      ...(m.own?.settings.keepAlive === undefined ? {} : { keepAliveMs: m.own.settings.keepAlive }),
    })),
    (name, ctx) => tracedLoad(catalog.find((m) => m.name === name)!, shared, ctx),
    {
      memoryBudget: budget,
      ...(config.maxLoadedModels === undefined ? {} : { maxLoaded: config.maxLoadedModels }),
      keepAliveMs: config.keepAlive,
      maxKeepAliveMs: keepAliveCap,
      log,
    },
  );
  const replica = config.nats === undefined
    ? undefined
    : await startModelsReplica(config, pool, catalog, shared, log);
  // The pool is closed once the HTTP side drained; with a replica, once its NATS streams did too.
  const directory: ModelDirectory = replica === undefined ? pool : {
    get names() {
      return pool.names;
    },
    has: (name) => pool.has(name),
    phaseOf: (name) => pool.phaseOf(name),
    acquire: (name, keepAliveMs, tenant) => pool.acquire(name, keepAliveMs, tenant),
    status: () => pool.status(),
    loaded: () => pool.loaded(),
    close: async () => {
      const r = await replica.drain();
      log(`replica drained: ${r.completed ? "all NATS streams finished" : `${r.aborted} aborted`}`);
      await replica.close();
      await pool.close();
    },
  };
  // One batch queue for every model: each line runs on the model its body names.
  const { batches, dataDir } = batchQueueFor(config, log);
  const service = createModelsFront({
    extend: batches.attach,
    cacheScope: config.cacheScope,
    pool: directory,
    catalog,
    metrics,
    modelMetrics: shared.metrics,
    apiKeys: config.apiKey,
    metricsPublic: config.metricsPublic,
    corsOrigins: config.corsOrigin,
    allowedHosts: config.allowedHost,
    requestLog,
    drainTimeoutMs: config.drainTimeout * 1000,
  });
  let listening!: Deno.NetAddr;
  const server = await serveService(service, {
    ...listenerOptions(config, openFileLimit()),
    onListen: (addr) => listening = addr,
  });
  // Started by the launcher, which is gone (killed without passing a signal on): drain as on
  // SIGTERM. A replica's NATS side watches for itself (replica_stop.ts).
  const deadline = stopOnRequest(server, config.drainTimeout, log);
  const resolved = await shared.resolved;
  log(
    [
      `llmserve ready (${catalog.length} models, each loaded on its first request)`,
      ...catalog.map((m) =>
        `  model     ${[m.name, ...(m.aliases ?? [])].join(", ")}: ${m.path} (${
          m.architecture ?? m.format
        }, ${m.quantization ?? "?"}, ${formatBytes(m.bytes)}${
          m.contextLength ? `, context ${m.contextLength}` : ""
        })`
      ),
      `  backend   ${
        describeWithGpuApi(describeChoice(resolved.backend, resolved))
      } (each model builds its own engine)`,
      `  memory    budget ${budget === Infinity ? "unlimited" : formatBytes(budget)}${
        config.memoryBudget === undefined ? " (auto: the free memory)" : ""
      }; ${
        config.maxLoadedModels === undefined
          ? "no limit on the models loaded but the budget"
          : `at most ${config.maxLoadedModels} models loaded`
      }; keep-alive ${formatKeepAlive(config.keepAlive)}, a request's at most ${
        formatKeepAlive(keepAliveCap)
      }; ${
        config.grammarPreload
          ? "each model's grammar engine started after its load, its size on a line of its own (--grammar-preload=false: on its first constrained request)"
          : "grammar engines on each model's first constrained request (--grammar-preload=false)"
      }`,
      `  kv cache  ${
        config.kvMemory === undefined ? "auto" : formatBytes(config.kvMemory)
      } per model, blocks of ${config.blockSize} tokens`,
      `  auth      ${config.apiKey.length > 0 ? `${config.apiKey.length} API key(s)` : "off"}`,
      `  batches   ${dataDir} (${config.batchConcurrency} lines at once; each line's "model" picks)`,
      ...(questions ? [`  similar   questions embedded by ${questions.description}`] : []),
      ...(replica
        ? [`  replica   ${replica.agent.id} on NATS ${replica.where} (serving every model)`]
        : []),
      `  url       http://${listening.hostname}:${listening.port}/  (playground, with a model picker; API under /v1; "model" picks)`,
    ].join("\n"),
  );
  const result = await server.closed;
  deadline.waitingOn("the batch queue");
  await batches.close();
  await questions?.close();
  log(drainedLine(result));
  return 0;
}

/**
 * The replica role of a server of several models: routers see every model in its heartbeats
 * (loaded or not, with its aliases), and a generate or info request for one not loaded loads
 * it through the pool, as an HTTP request would. On SIGTERM/SIGINT or the launcher's end it
 * leaves the rotation at once, then drains with the HTTP side.
 */
async function startModelsReplica(
  config: Config,
  pool: ModelPool<ServiceApp>,
  catalog: readonly ServedFile[],
  shared: Shared,
  log: (line: string) => void,
) {
  const sources = shared.replicaSources!;
  const link = await connectReplica(config, log, shared.resultStore);
  const models: ReplicaModels = {
    maxRunning: config.maxRunning,
    maxWaiting: config.maxWaiting,
    blockSize: config.blockSize,
    list: () =>
      pool.status().map((s) => {
        const source = sources.get(s.name);
        const modelId = shared.modelIds?.get(s.name);
        const aliases = catalog.find((m) => m.name === s.name)?.aliases ?? [];
        return {
          name: s.name,
          ...(aliases.length === 0 ? {} : { aliases }),
          ...(modelId === undefined ? {} : { modelId }),
          phase: s.phase,
          ...(source === undefined || s.phase !== "loaded" ? {} : { source }),
        };
      }),
    acquire: async (name) => {
      const lease = await pool.acquire(name);
      const source = sources.get(name);
      if (source === undefined) {
        lease.release();
        throw new Error(`model ${JSON.stringify(name)} loaded without a replica source`);
      }
      return { source, release: () => lease.release() };
    },
  };
  return await startReplicaAgent(config, link, models, log, shared.requestLog);
}
