import type { Hono, MiddlewareHandler } from "hono";
import type { WSContext } from "hono/ws";
import { HTTP_DEFAULTS } from "./defaults.ts";
import { trace, type Tracer } from "@opentelemetry/api";
import type { GenerationBackend } from "../core/generation.ts";
import { createChatRenderer } from "../chat/chat_template.ts";
import { templateTools, toolFormatName } from "../chat/tools.ts";
import { type FrontDoor, frontDoor, type FrontDoorOptions } from "./front_door.ts";
import type { CatalogModel } from "./model_directory.ts";
import { registerModelRoutes } from "./model_catalog.ts";
import { registerHealthRoutes } from "./health_routes.ts";
import { InFlightRegistry } from "./inflight.ts";
import { type OpenAiHandler, openAiHandler, registerOpenAiRoutes } from "./openai_routes.ts";
import { registerOllamaRoutes } from "./ollama_routes.ts";
import { messagesHandler, registerAnthropicRoutes } from "./anthropic_routes.ts";
import { registerResponsesRoutes } from "./responses_routes.ts";
import { PLAYGROUND_HTML } from "./playground.html.ts";
import { registerPropsRoute, type ServerProps } from "./props_route.ts";
import { embeddingsHandler, registerEmbeddingsRoute } from "./embeddings_route.ts";
import { registerRerankRoute } from "./rerank_route.ts";
import { RequestLog } from "./request_log.ts";
import { ServiceMetrics } from "./service_metrics.ts";
import { registerStreamRoute } from "./stream_route.ts";
import { registerTokenizeRoutes } from "./tokenize_routes.ts";
import type { GenerationDeps } from "./tracked_generation.ts";

/** createApp's options: the front door's (front_door.ts), and what the routes need. */
export interface AppOptions extends Omit<FrontDoorOptions, "metrics" | "maxBodyBytes"> {
  readonly backend: GenerationBackend;
  /** HTTP request body limit (default 1 MiB). */
  readonly maxBodyBytes?: number;
  /** WebSocket client frame limit (default 256 KiB). */
  readonly maxFrameBytes?: number;
  /** Live generations allowed on one socket (default 64). */
  readonly maxGenerationsPerSocket?: number;
  /** A socket's generations pause while more than this is buffered for it (default 1 MiB). */
  readonly wsHighWaterBytes?: number;
  /** ...and resume below this (default a quarter of the high-water mark). */
  readonly wsLowWaterBytes?: number;
  /**
   * A socket congested this long is closed with 1008 (default 60 s), and an SSE stream whose
   * client took nothing for this long is cut and its generation cancelled.
   */
  readonly wsStallTimeoutMs?: number;
  /** A WebSocket with no frame and no generation for this long is closed (default 300 s; 0: never). */
  readonly wsIdleTimeoutMs?: number;
  /**
   * WebSockets one client address may hold open (default 256): past it an upgrade is refused
   * with 429, so one client cannot take every connection slot (behind a proxy, every client
   * has the proxy's address).
   */
  readonly wsMaxPerClient?: number;
  /** Period of `stats` frames to subscribed sockets (default 500 ms). */
  readonly statsIntervalMs?: number;
  /** drain() deadline when none is given (default 30 s). */
  readonly drainTimeoutMs?: number;
  /** max_tokens for /v1/completions when the client gives none (OpenAI: 16). */
  readonly defaultCompletionMaxTokens?: number;
  /** Share one with the core so it can call observeStep(); created if absent. */
  readonly metrics?: ServiceMetrics;
  /** Defaults to the global tracer provider's "llmserve" tracer. */
  readonly tracer?: Tracer;
  /** False while the model loads: /ready answers 503 until setReady(true). Default true. */
  readonly ready?: boolean;
  /**
   * Names clients may give as `model` (vLLM's --served-model-name, llama-server's --alias);
   * /v1/models lists them. Default: the backend's model name. Read at each request, not
   * copied: a router adds the aliases its replicas advertise as it hears them.
   */
  readonly servedModelNames?: readonly string[];
  /** Extra facts for GET /props (model path, limits). */
  readonly props?: ServerProps;
  /**
   * Models this app's front serves besides its own (a plain router's other models, which
   * replicas advertise): /v1/models lists them after its own. `dispatch` sends their requests.
   */
  readonly moreModels?: () => readonly CatalogModel[];
  /**
   * Mounted behind the front door's middleware, before the routes: picks what answers a request
   * naming another model (lib/http/model_dispatch.ts), else passes it to this app's routes.
   */
  readonly dispatch?: (door: FrontDoor) => MiddlewareHandler;
  /** Mounts more routes behind the same middleware (the batch queue, lib/batch/). */
  readonly extend?: (app: Hono, ctx: AppContext) => void;
}

/** What routes mounted by `extend` get from the app. */
export interface AppContext {
  /** The completion routes' handler, for work the server runs itself. */
  readonly openAi: OpenAiHandler;
  /** The cache scope of an authenticated request (with --cache-scope key). */
  readonly scopeOf: (req: Request) => string | undefined;
  /** The HTTP body limit: a request that big is refused wherever it comes from. */
  readonly maxBodyBytes: number;
}

export interface DrainResult {
  /** True when every in-flight generation finished before the deadline. */
  readonly completed: boolean;
  /** Generations aborted at the deadline. */
  readonly aborted: number;
}

export interface ServiceApp {
  readonly app: Hono;
  /** The request handler: serveService() (lib/http/serve.ts) puts it on node:http. */
  readonly fetch: (req: Request, info?: unknown) => Response | Promise<Response>;
  readonly metrics: ServiceMetrics;
  /**
   * Stops new generations (503 "draining", /ready 503), waits for in-flight ones up to
   * `timeoutMs`, aborts what is left, then closes WebSockets with 1001.
   */
  drain(opts?: { timeoutMs?: number }): Promise<DrainResult>;
  /** Ends a drain's wait now: what is still running is aborted as at the deadline. */
  hurry(): void;
  setReady(ready: boolean): void;
  readonly draining: boolean;
  /** Generations open over HTTP and WebSocket. */
  readonly inFlight: number;
  /** Open WebSocket sessions. */
  readonly sockets: number;
  /** Closes every WebSocket and stops timers (after drain, or in tests). */
  close(): void;
  /**
   * The completion routes' handler, without the routes' key check (the caller made it): the
   * front of a server of several models runs batch lines on each model's app through it.
   */
  readonly openAi?: OpenAiHandler;
  /**
   * Serves a `/v1/stream` socket upgraded elsewhere: the front of a server of several models
   * upgrades at once, sends `loading` frames while the model loads, then hands the socket to
   * the model's app. `upgrade` is the upgrade request (its API key gives the cache scope, its
   * checks were the front's); the socket's client frames go to onMessage, its close to onClose.
   */
  adoptSocket?(
    ws: WSContext,
    upgrade: Request,
    sessionId: string,
    /** The client's address: its sockets count against wsMaxPerClient here too. */
    client?: string,
  ): Promise<{ onMessage(data: unknown): void; onClose(): void }>;
}

/**
 * Builds the client-facing service over a generation backend: the WebSocket protocol on
 * /v1/stream, the OpenAI-compatible API, health, readiness, metrics and the playground.
 *
 * Behind the front door's middleware and error mapping (front_door.ts), which the front of
 * several models (models_front.ts) shares.
 */
export function createApp(opts: AppOptions): ServiceApp {
  const backend = opts.backend;
  const metrics = opts.metrics ?? new ServiceMetrics();
  const tracer = opts.tracer ?? trace.getTracer("llmserve");
  const inflight = new InFlightRegistry();
  const maxBodyBytes = opts.maxBodyBytes ?? HTTP_DEFAULTS.maxBodyBytes;
  const defaultCompletionMaxTokens = opts.defaultCompletionMaxTokens ??
    HTTP_DEFAULTS.defaultCompletionMaxTokens;
  const servedModelNames = opts.servedModelNames?.length
    ? opts.servedModelNames
    : [backend.modelName];
  const requestLog = opts.requestLog ?? new RequestLog();
  const renderChat = createChatRenderer({
    template: backend.chatTemplate,
    bosToken: backend.bosToken,
    eosToken: backend.eosToken,
    specialTokens: backend.specialTokens,
  });
  let loaded = opts.ready ?? true;
  let draining = false;

  const door = frontDoor({ ...opts, metrics, requestLog, maxBodyBytes });
  const { app, records, auth } = door;
  const scopeOf = (req: Request) => auth.scopeOf(req);
  if (opts.dispatch !== undefined) app.use("*", opts.dispatch(door));

  const deps: GenerationDeps = {
    backend,
    metrics,
    tracer,
    inflight,
    isDraining: () => draining,
    requestLog,
  };
  const highWater = opts.wsHighWaterBytes ?? HTTP_DEFAULTS.wsHighWaterBytes;
  const sessionOpts = {
    renderChat,
    maxFrameBytes: opts.maxFrameBytes ?? HTTP_DEFAULTS.maxFrameBytes,
    maxGenerationsPerSocket: opts.maxGenerationsPerSocket ?? HTTP_DEFAULTS.maxGenerationsPerSocket,
    statsIntervalMs: opts.statsIntervalMs ?? HTTP_DEFAULTS.statsIntervalMs,
    idleTimeoutMs: opts.wsIdleTimeoutMs ?? HTTP_DEFAULTS.wsIdleTimeoutMs,
    writer: {
      highWaterBytes: highWater,
      lowWaterBytes: opts.wsLowWaterBytes ??
        Math.floor(highWater * HTTP_DEFAULTS.wsLowWaterFraction),
      stallTimeoutMs: opts.wsStallTimeoutMs ?? HTTP_DEFAULTS.wsStallTimeoutMs,
    },
  };

  app.get("/", (c) => c.html(PLAYGROUND_HTML));
  registerHealthRoutes(app, {
    backend,
    metrics,
    inflight,
    isLoaded: () => loaded,
    isDraining: () => draining,
  });
  const tools = templateTools(backend.chatTemplate);
  const openAiOpts = {
    renderChat,
    templateTools: tools,
    maxBodyBytes,
    defaultCompletionMaxTokens,
    createdAt: Math.floor(Date.now() / 1000),
    servedModelNames,
    recordOf: (req: Request) => records.of(req),
    scopeOf,
    stallTimeoutMs: opts.wsStallTimeoutMs ?? HTTP_DEFAULTS.wsStallTimeoutMs,
  };
  registerModelRoutes(app, {
    catalog: () => [
      {
        name: servedModelNames[0]!,
        aliases: servedModelNames.slice(1),
        root: backend.modelName,
        contextLength: backend.contextLength,
        toolFormat: toolFormatName(tools),
      },
      ...(opts.moreModels?.() ?? []),
    ],
    createdAt: openAiOpts.createdAt,
  });
  registerOpenAiRoutes(app, deps, openAiOpts);
  const embeddingsOpts = { backend, maxBodyBytes, servedModelNames };
  const openAi = openAiHandler(deps, openAiOpts, {
    embeddings: embeddingsHandler(embeddingsOpts),
    messages: messagesHandler(deps, openAiOpts),
  });
  registerOllamaRoutes(app, deps, { openAi: openAiOpts, modelPath: opts.props?.modelPath });
  registerAnthropicRoutes(app, deps, openAiOpts);
  registerResponsesRoutes(app, deps, openAiOpts);
  opts.extend?.(app, { openAi, scopeOf, maxBodyBytes });
  registerTokenizeRoutes(app, {
    backend,
    renderChat,
    templateTools: tools,
    maxBodyBytes,
    servedModelNames,
  });
  registerEmbeddingsRoute(app, embeddingsOpts);
  registerRerankRoute(app, embeddingsOpts);
  registerPropsRoute(app, {
    backend,
    servedModelNames,
    props: opts.props ?? {},
    limits: {
      max_body_bytes: maxBodyBytes,
      max_frame_bytes: sessionOpts.maxFrameBytes,
      max_generations_per_socket: sessionOpts.maxGenerationsPerSocket,
      default_completion_max_tokens: defaultCompletionMaxTokens,
    },
    isLoaded: () => loaded,
  });
  const sockets = registerStreamRoute(app, {
    deps,
    session: sessionOpts,
    maxPerClient: opts.wsMaxPerClient ?? HTTP_DEFAULTS.wsMaxPerClient,
    isDraining: () => draining,
    requestIdOf: (req) => records.of(req)?.id,
    scopeOf,
    onRefused: (e) => metrics.errors.inc({ code: e.code }),
  });

  const hurried = new AbortController();
  return {
    app,
    fetch: (req, info) => app.fetch(req, info as never),
    metrics,
    openAi,
    async adoptSocket(ws, upgrade, sessionId, client) {
      return sockets.adopt(ws, sessionId, await auth.scopeOfUpgrade(upgrade), client);
    },
    async drain(d = {}) {
      draining = true;
      const completed = await inflight.whenIdle(
        d.timeoutMs ?? opts.drainTimeoutMs ?? HTTP_DEFAULTS.drainTimeoutSeconds * 1000,
        hurried.signal,
      );
      let aborted = 0;
      if (!completed) {
        aborted = inflight.abortAll("drain deadline passed");
        // Aborted generations end with a final event; give them a moment to send it (within
        // the second past the deadline that the drain may take).
        await inflight.whenIdle(500);
      }
      sockets.closeAll();
      return { completed, aborted };
    },
    hurry() {
      hurried.abort();
    },
    setReady(ready) {
      loaded = ready;
    },
    get draining() {
      return draining;
    },
    get inFlight() {
      return inflight.size;
    },
    get sockets() {
      return sockets.size;
    },
    close: () => sockets.closeAll(),
  };
}
