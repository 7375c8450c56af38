import { openModelFor, uploadProgress } from "./open_model.ts";
import { startPipelineHead } from "./pipeline_head.ts";
import { modelStem } from "../source/model_source.ts";
import { openSimilarCacheModel } from "./similar_cache_model.ts";
import { stopOnRequest } from "./stop_deadline.ts";
import { connectReplica, startReplicaAgent } from "./replica_role.ts";
import { serveModelsCommand } from "./serve_models.ts";
import { parseServeArgs } from "./serve_args.ts";
import { printInfo } from "./help.ts";
import type { ServingCore } from "../../actors/core.ts";
import { formatBytes } from "../util/byte_size.ts";
import { formatKeepAlive } from "../util/duration.ts";
import { describeWithGpuApi } from "../util/gpu_api.ts";
import type { Config } from "./config.ts";
import { grammarPendingNote, startGrammarInBackground } from "../compose/grammar_preload.ts";
import { engineMemory, resolveBackend } from "../compose/engine_factory.ts";
import { openServing, planServing } from "../compose/open_serving.ts";
import { modelAppOptions, servedBackend, servingSettings } from "./serving_settings.ts";
import { sharedResultStore } from "./shared_cache_config.ts";
import type { NatsResultStore } from "../cluster/nats_result_store.ts";
import { FAULT_ENV, FaultInjector } from "../engine/fault_injection.ts";
import type { Engine } from "../engine/engine.ts";
import type { GenerationBackend } from "../core/generation.ts";
import { createApp } from "../http/app.ts";
import { batchQueueFor } from "./batch_queue_config.ts";
import { serveService } from "../http/serve.ts";
import { ServiceMetrics } from "../http/service_metrics.ts";
import { RequestLog } from "../http/request_log.ts";
import { drainedLine } from "./serve_lines.ts";
import { createChatRenderer } from "../chat/chat_template.ts";
import { leveledLog } from "../util/log_level.ts";
import { createLoadingService, LoadProgress, SwitchableService } from "../http/loading_service.ts";
import type { CoreBackend } from "../backend/core_backend.ts";
import { coreReplicaSource } from "../cluster/replica_source.ts";
import { identityOrWarning } from "../cluster/model_identity.ts";
import type { Model } from "../model/weights.ts";
import { openFileLimit } from "../util/fd_limit.ts";
import { listenerOptions } from "./listener_options.ts";

/**
 * `serve` command: binds the port first (so a port in use is reported at once and /health can
 * say how loading goes), loads the model, starts the actors, then switches the listener from
 * the loading service to the real one; drains on SIGTERM.
 */
export async function serveCommand(argv: string[]): Promise<number> {
  if (printInfo("serve", argv)) return 0;
  const config = parseServeArgs(argv);
  // Read and parsed before the port is bound: a typo in the file fails the start at once.
  const chatTemplate = config.chatTemplate === undefined
    ? undefined
    : await readChatTemplate(config.chatTemplate);
  if (config.models.length > 0 || config.allModels || config.modelsConfig !== undefined) {
    return await serveModelsCommand(config, chatTemplate);
  }
  const logger = leveledLog(config.logLevel);
  // Start-up, ready and drain lines are written at every level: a few per run, and the only
  // word that the server is up or gone.
  const log = (line: string) => console.error(line);
  const metrics = new ServiceMetrics();
  const requestLog = new RequestLog(config.logFormat, undefined, {
    level: config.logLevel,
    probes: config.logProbes,
  });
  const progress = new LoadProgress();
  const front = new SwitchableService(createLoadingService(progress, {
    requestLog,
    metrics,
    apiKeys: config.apiKey,
    corsOrigins: config.corsOrigin,
    allowedHosts: config.allowedHost,
  }));
  let listening!: Deno.NetAddr;
  const fdLimit = openFileLimit();
  const listener = listenerOptions(config, fdLimit);
  const server = await serveService(front, {
    ...listener,
    log: logger.warn,
    onListen: (addr) => {
      listening = addr;
      log(`llmserve listening on http://${addr.hostname}:${addr.port}/ (loading the model)`);
    },
  });
  // Started by the launcher, which is gone (killed without passing a signal on): drain as on
  // SIGTERM. A replica's NATS side watches for itself (replica_stop.ts).
  const deadline = stopOnRequest(server, config.drainTimeout, log);
  // A signal while loading ends the run; the load is abandoned with the process.
  const loaded = start(config, progress, metrics, requestLog, chatTemplate, log);
  const first = await Promise.race([loaded, server.closed.then(() => null)]);
  if (first === null) {
    log("stopped before the model finished loading");
    return 0;
  }
  const { service, core, summary, replica, batches, grammarEngine, questions, pipeline } = first;
  front.switchTo(service);
  progress.set("ready");
  log(
    summary(listening) + "\n" + [
      `  origins   same origin${
        config.corsOrigin.length > 0 ? ` + ${config.corsOrigin.join(", ")}` : " only"
      }${config.allowedHost.length > 0 ? `; host names ${config.allowedHost.join(", ")}` : ""}`,
      `  conns     ${listener.maxConnections} at most${
        config.maxConnections === undefined ? ` (open-file limit ${fdLimit ?? "unknown"})` : ""
      }; timeouts: header ${config.headerTimeout} s, body ${config.bodyTimeout} s, keep-alive ${config.keepAliveTimeout} s`,
    ].join("\n"),
  );
  // After the ready line, so readiness never waits for it; its size follows on its own line.
  if (config.grammarPreload && grammarEngine) startGrammarInBackground(grammarEngine.start, log);
  const result = await server.closed;
  if (replica) {
    // Started by the stop request already, whatever it was; asked for here too, so that no way
    // of closing the HTTP side leaves this waiting for a request that never comes.
    deadline.waitingOn("the replica's NATS streams");
    const r = await replica.drain();
    log(`replica drained: ${r.completed ? "all NATS streams finished" : `${r.aborted} aborted`}`);
    deadline.waitingOn("closing the NATS connection");
    await replica.close();
  }
  deadline.waitingOn("the batch queue");
  await batches.close();
  deadline.waitingOn("the engine's close");
  await core.close();
  await questions?.close();
  if (pipeline) {
    deadline.waitingOn("the pipeline's stages");
    await pipeline.close();
  }
  log(drainedLine(result));
  return 0;
}

/**
 * How much of the KV cache is resident: the CPU engine's pages fill as blocks are written, the
 * WebGPU engine's pools grow as steps name blocks past them.
 */
function kvResidency(mem: { kvCache: number; kvResident?: number } | undefined): string {
  if (mem === undefined) return "";
  if (mem.kvResident === undefined) return "";
  return ` reserved, ${formatBytes(mem.kvResident)} resident (it grows as blocks are written)`;
}

/** Loads the model, builds engine, core and app: everything between binding and ready. */
async function start(
  config: Config,
  progress: LoadProgress,
  metrics: ServiceMetrics,
  requestLog: RequestLog,
  chatTemplate: string | undefined,
  log: (line: string) => void,
) {
  // Asked while the model loads: the adapter probe is a child process of its own.
  // Pipeline stages and tensor-parallel ranks run the CPU engine: "auto" means it there
  // (pipeline_head.ts refuses others).
  const split = config.pipelineParallelSize > 1 || config.tensorParallelSize > 1;
  const resolving = resolveBackend(split ? "cpu" : config.backend);
  const pipeline = split ? await startPipelineHead(config, log) : undefined;
  // The core is built below; stage spans link to its requests once it is there.
  const built: { core?: ServingCore } = {};
  pipeline?.observeInto(metrics, () => built.core && ((ids) => built.core!.requestLinks(ids)));
  const { source, tokenizer, ...opened } = await openModelFor(
    config,
    "serve",
    (phase, bytes, total) => progress.set(phase, bytes, total),
    pipeline?.placeTensors,
  );
  const settings = servingSettings(config);
  const resolved = await resolving;
  const { plan, kv, model } = await planServing(
    opened.model,
    resolved,
    settings.kvRequest,
    settings.engineOptions,
  );
  const numBlocks = plan.numBlocks;
  progress.set("building_engine");
  // The upload to the device is most of building the engine: its bytes are the phase's progress.
  const bar = uploadProgress(source.modelPath);
  // Test-only: LLMSERVE_FAULT_STEPS makes chosen engine steps fail (see lib/fault_injection.ts).
  const faults = FaultInjector.fromEnv();
  const { core, engine, description, grammarEngine } = await openServing({
    ...settings.core,
    model,
    tokenizer,
    resolved,
    kv,
    onUpload: (bytes, total) => {
      bar(bytes, total);
      progress.set("building_engine", bytes, total);
    },
    warmUp: () => progress.set("warming_up"),
    ...(faults ? { wrapEngine: (e: Engine) => faults.wrap(e) } : {}),
    ...(pipeline ? { buildEngine: () => pipeline.build(model, kv, settings.core.limits) } : {}),
    metrics,
  });
  built.core = core;
  const modelName = modelStem(source.modelPath);
  const shared = sharedResultStore(config, log);
  const questions = config.similarCacheModel !== undefined && config.similarCache !== undefined
    ? await openSimilarCacheModel(config, config.similarCacheModel)
    : undefined;
  const { coreBackend, backend } = servedBackend(
    config,
    {
      name: modelName,
      core,
      tokenizer,
      model,
      ...(chatTemplate ?? model.chatTemplate
        ? { chatTemplate: chatTemplate ?? model.chatTemplate }
        : {}),
    },
    shared,
    questions?.embedder,
  );
  const servedModelNames = config.servedModelName.length > 0 ? config.servedModelName : [modelName];
  const { batches, dataDir } = batchQueueFor(config, log);
  const service = createApp(modelAppOptions(config, {
    extend: batches.attach,
    backend,
    metrics,
    servedModelNames,
    requestLog,
    modelPath: source.modelPath,
    description,
    kvBlocks: numBlocks,
  }));
  const replica = config.nats === undefined ? undefined : await startReplica(config, {
    servedModelNames,
    coreBackend,
    backend,
    shared,
    core,
    model,
    blockSize: plan.blockSize,
    modelPath: source.modelPath,
    log,
    requestLog,
  });
  const c = model.config;
  const mem = engineMemory(engine);
  const summary = (addr: Deno.NetAddr) =>
    [
      `llmserve ready`,
      `  model     ${source.modelPath} (${c.architecture}, ${c.nLayers} layers, dim ${c.dim}, ${c.nHeads}/${c.nKvHeads} heads of ${c.headDim}, vocab ${c.vocabSize}, context ${c.contextLength})`,
      `  served as ${servedModelNames.join(", ")}`,
      `  backend   ${describeWithGpuApi(description)}`,
      `  memory    weights ${mem ? formatBytes(mem.weights) : "?"}, kv cache ${
        formatBytes(mem?.kvCache ?? plan.bytes)
      }${kvResidency(mem)}${grammarEngine ? `; ${grammarPendingNote(config.grammarPreload)}` : ""}`,
      // The engine's own size: auto plans in f32, and the CPU engine holds the blocks in f16.
      `  kv cache  ${numBlocks} blocks x ${plan.blockSize} tokens = ${
        formatBytes(mem?.kvCache ?? plan.bytes)
      } (${numBlocks * plan.blockSize} tokens; ${plan.why})`,
      `  chat      ${
        chatTemplate !== undefined
          ? `template from --chat-template ${config.chatTemplate}`
          : model.chatTemplate !== undefined && model.chatTemplate.trim() !== ""
          ? "the model's template"
          : "plain format (the model has no template; System:/User:/Assistant: lines)"
      }`,
      `  limits    ${config.maxBatchTokens} tokens/step, ${config.maxRunning} running, ${config.maxWaiting} waiting, pipeline depth ${
        pipelineDepthText(core.scheduler)
      }`,
      `  results   ${
        config.resultCache > 0 ? `cache ${formatBytes(config.resultCache)}` : "cache off"
      }${
        shared ? `, shared on NATS (entries live ${formatKeepAlive(config.sharedCacheTtl)})` : ""
      }`,
      `  auth      ${config.apiKey.length > 0 ? `${config.apiKey.length} API key(s)` : "off"}${
        config.metricsPublic ? " (/metrics public)" : ""
      }`,
      `  batches   ${dataDir} (${config.batchConcurrency} lines at once)`,
      ...(questions ? [`  similar   questions embedded by ${questions.description}`] : []),
      ...(replica ? [`  replica   ${replica.agent.id} on NATS ${replica.where}`] : []),
      `  url       http://${addr.hostname}:${addr.port}/  (playground; API under /v1)`,
      ...(faults
        ? [
          `  faults    ${FAULT_ENV}=${Deno.env.get(FAULT_ENV)} (test-only fault injection is on)`,
        ]
        : []),
    ].join("\n");
  return { service, core, summary, replica, batches, grammarEngine, questions, pipeline };
}

/**
 * The replica role beside the HTTP server: the same core takes generations from routers over
 * NATS. On SIGTERM/SIGINT or the launcher's end it leaves the rotation at once, then drains
 * with the HTTP side.
 */
async function startReplica(
  config: Config,
  deps: {
    /** The names it serves: routers know it by the first, and the rest as its aliases. */
    servedModelNames: readonly string[];
    coreBackend: CoreBackend;
    /** What streams run through: the result cache's where it is on, else coreBackend. */
    backend: GenerationBackend;
    /** The result cache's shared level, kept on this replica's connection. */
    shared: NatsResultStore | undefined;
    core: ServingCore;
    model: Model;
    blockSize: number;
    modelPath: string;
    log: (line: string) => void;
    requestLog: RequestLog;
  },
) {
  const link = await connectReplica(config, deps.log, deps.shared);
  const { coreBackend, core, model } = deps;
  return await startReplicaAgent(
    config,
    link,
    {
      ...coreReplicaSource({
        backend: coreBackend,
        core,
        tokenizer: model.tokenizer!,
        blockSize: deps.blockSize,
        modelName: deps.servedModelNames[0]!,
        aliases: deps.servedModelNames.slice(1),
        modelId: await identityOrWarning(deps.modelPath, coreBackend.contextLength, deps.log),
        limits: config,
      }),
      // Streams from routers take the result cache too (and its shared level).
      backend: deps.backend,
    },
    deps.log,
    deps.requestLog,
  );
}

/** `--chat-template <file>`: its text, refused with the file's name when unreadable or invalid. */
async function readChatTemplate(path: string): Promise<string> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    throw new Error(
      `Cannot read --chat-template ${JSON.stringify(path)}: ${e instanceof Error ? e.message : e}`,
    );
  }
  if (text.trim() === "") {
    throw new Error(`Cannot use --chat-template ${JSON.stringify(path)}: the file is empty`);
  }
  try {
    createChatRenderer({ template: text, bosToken: "", eosToken: "" });
  } catch (e) {
    throw new Error(
      `Cannot use --chat-template ${JSON.stringify(path)}: ${e instanceof Error ? e.message : e}`,
    );
  }
  return text;
}

/** "8", or "3-8 (adapts to the step rate)" where the core adapts it. */
function pipelineDepthText(s: { minPipelineDepth: number; maxInFlight: number }): string {
  return s.minPipelineDepth === s.maxInFlight
    ? `${s.maxInFlight}`
    : `${s.minPipelineDepth}-${s.maxInFlight} (adapts to the step rate)`;
}
