import { Hono } from "hono";
import { upgradeWebSocket } from "@hono/node-server";
import { cors } from "hono/cors";
import type { WSContext } from "hono/ws";
import { trace, type Tracer } from "@opentelemetry/api";
import type { GenerationBackend } from "../core/generation.ts";
import { ApiKeyVerifier, keyScope, parseAuthorization } from "./auth.ts";
import { createChatRenderer } from "./chat_template.ts";
import { ApiError, toApiError } from "./errors.ts";
import type { FrameSocket } from "./frame_writer.ts";
import { registerHealthRoutes } from "./health_routes.ts";
import { InFlightRegistry } from "./inflight.ts";
import { OriginPolicy } from "./origin.ts";
import { type OpenAiHandler, openAiHandler, registerOpenAiRoutes } from "./openai_routes.ts";
import { PLAYGROUND_HTML } from "./playground.html.ts";
import { ServiceMetrics } from "./service_metrics.ts";
import { isValidRequestId, newRequestId, RequestLog, type RequestRecord } from "./request_log.ts";
import { registerTokenizeRoutes } from "./tokenize_routes.ts";
import { registerPropsRoute, type ServerProps } from "./props_route.ts";
import type { GenerationDeps } from "./tracked_generation.ts";
import { CLOSE_GOING_AWAY, StreamSession } from "./ws_session.ts";

export interface AppOptions {
  readonly backend: GenerationBackend;
  /** Accepted bearer tokens; empty or absent turns authentication off. */
  readonly apiKeys?: readonly string[];
  /**
   * Who shares the result cache and the prefix cache: "key" (default) keeps each API key's
   * cached work to itself, so one tenant cannot learn from hits or `cached_tokens` what another
   * asked; "global" shares them among all keys. Without API keys everything is one scope.
   */
  readonly cacheScope?: "key" | "global";
  /**
   * Origins (exact, or globs like `http://localhost:*`) whose pages may call the API and open
   * WebSockets, besides the server's own origin; `*` allows every page.
   */
  readonly corsOrigins?: readonly string[];
  /** Host names the server answers to besides IP literals and localhost (DNS rebinding). */
  readonly allowedHosts?: readonly string[];
  /** Paths served without a key (default: /, /health, /ready). */
  readonly openPaths?: readonly string[];
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
  /** Retry-After seconds on 503 overloaded/draining (default 1). */
  readonly retryAfterSeconds?: number;
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
   * /v1/models lists them. Default: the backend's model name.
   */
  readonly servedModelNames?: readonly string[];
  /** Serve /metrics without an API key (so Prometheus can scrape it). Default false. */
  readonly metricsPublic?: boolean;
  /** Where request-log lines go; default text lines on stderr. */
  readonly requestLog?: RequestLog;
  /** Extra facts for GET /props (model path, limits). */
  readonly props?: ServerProps;
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
   * Serves a `/v1/stream` socket upgraded elsewhere: the front of a server of several models
   * upgrades at once, sends `loading` frames while the model loads, then hands the socket to
   * the model's app. `upgrade` is the upgrade request (its API key gives the cache scope, its
   * checks were the front's); the socket's client frames go to onMessage, its close to onClose.
   */
  /**
   * The completion routes' handler, without the routes' key check (the caller made it): the
   * front of a server of several models runs batch lines on each model's app through it.
   */
  readonly openAi?: OpenAiHandler;
  adoptSocket?(
    ws: WSContext,
    upgrade: Request,
    sessionId: string,
    /** The client's address: its sockets count against wsMaxPerClient here too. */
    client?: string,
  ): Promise<{ onMessage(data: unknown): void; onClose(): void }>;
}

/**
 * Every route and its methods: the routes get their own label in llm_http_requests_total
 * (others are "unmatched"), and another method on them is answered 405 with `Allow`.
 */
const ROUTE_METHODS: Record<string, string> = {
  "/": "GET, HEAD",
  "/health": "GET, HEAD",
  "/ready": "GET, HEAD",
  "/metrics": "GET, HEAD",
  "/v1/stream": "GET",
  "/v1/models": "GET, HEAD",
  "/v1/completions": "POST",
  "/v1/chat/completions": "POST",
  "/tokenize": "POST",
  "/detokenize": "POST",
  "/props": "GET, HEAD",
};
const ROUTES = new Set(Object.keys(ROUTE_METHODS));

function frameSocket(ws: WSContext): FrameSocket {
  const raw = ws.raw as { bufferedAmount?: number } | undefined;
  return {
    send: (text) => ws.send(text),
    // Deno's WebSocket counts bytes handed to send() and not yet written to the network.
    get bufferedAmount() {
      return raw?.bufferedAmount ?? 0;
    },
    get isOpen() {
      return ws.readyState === 1;
    },
    close: (code, reason) => ws.close(code, reason),
  };
}

/**
 * Builds the client-facing service over a generation backend: the WebSocket protocol on
 * /v1/stream, the OpenAI-compatible API, health, readiness, metrics and the playground.
 */
export function createApp(opts: AppOptions): ServiceApp {
  const backend = opts.backend;
  const metrics = opts.metrics ?? new ServiceMetrics();
  const tracer = opts.tracer ?? trace.getTracer("llmserve");
  const inflight = new InFlightRegistry();
  const keys = new ApiKeyVerifier(opts.apiKeys ?? []);
  const origins = new OriginPolicy(opts.corsOrigins ?? [], opts.allowedHosts ?? []);
  const openPaths = new Set(opts.openPaths ?? ["/", "/health", "/ready"]);
  if (opts.metricsPublic === true) openPaths.add("/metrics");
  const servedModelNames = opts.servedModelNames?.length
    ? [...opts.servedModelNames]
    : [backend.modelName];
  const requestLog = opts.requestLog ?? new RequestLog();
  const records = new WeakMap<Request, RequestRecord>();
  /** Each authenticated request's cache scope (with --cache-scope key). */
  const scopes = new WeakMap<Request, string>();
  const scopeByKey = opts.cacheScope !== "global";
  const retryAfter = String(opts.retryAfterSeconds ?? 1);
  const renderChat = createChatRenderer({
    template: backend.chatTemplate,
    bosToken: backend.bosToken,
    eosToken: backend.eosToken,
    specialTokens: backend.specialTokens,
  });
  let loaded = opts.ready ?? true;
  let draining = false;
  const sessions = new Set<StreamSession>();
  /** Open WebSockets by client address. */
  const socketsByClient = new Map<string, number>();
  const maxPerClient = opts.wsMaxPerClient ?? 256;
  let sessionCounter = 0;

  const deps: GenerationDeps = {
    backend,
    metrics,
    tracer,
    inflight,
    isDraining: () => draining,
    requestLog,
  };
  const highWater = opts.wsHighWaterBytes ?? 1 << 20;
  const sessionOpts = {
    renderChat,
    maxFrameBytes: opts.maxFrameBytes ?? 256 * 1024,
    maxGenerationsPerSocket: opts.maxGenerationsPerSocket ?? 64,
    statsIntervalMs: opts.statsIntervalMs ?? 500,
    idleTimeoutMs: opts.wsIdleTimeoutMs ?? 300_000,
    writer: {
      highWaterBytes: highWater,
      lowWaterBytes: opts.wsLowWaterBytes ?? Math.floor(highWater / 4),
      stallTimeoutMs: opts.wsStallTimeoutMs ?? 60_000,
    },
  };

  const app = new Hono();

  const errorResponse = (e: ApiError, req: Request): Response => {
    metrics.errors.inc({ code: e.code });
    const record = records.get(req);
    if (record) record.code = e.code;
    const headers: Record<string, string> = {};
    if (e.status === 503) headers["retry-after"] = retryAfter;
    if (e.status === 401) headers["www-authenticate"] = 'Bearer realm="llmserve"';
    if (e.code === "upgrade_required") headers["sec-websocket-version"] = "13";
    if (e.code === "method_not_allowed") headers["allow"] = allowedMethods(new URL(req.url).pathname)!;
    return Response.json(e.toJSON(), { status: e.status, headers });
  };
  const allowedMethods = (path: string): string | undefined =>
    ROUTE_METHODS[path] ?? (path.startsWith("/v1/models/") ? "GET, HEAD" : undefined);
  app.onError((err, c) => errorResponse(toApiError(err), c.req.raw));
  app.notFound((c) => {
    const allow = allowedMethods(c.req.path);
    return errorResponse(
      allow === undefined
        ? new ApiError("not_found", `No route for ${c.req.method} ${c.req.path}`)
        : new ApiError(
          "method_not_allowed",
          `${c.req.path} does not take ${c.req.method}; use ${allow}`,
        ),
      c.req.raw,
    );
  });

  // Request id, request log and request counter: first, so they see every answer, errors
  // and refusals included.
  app.use("*", async (c, next) => {
    const route = ROUTES.has(c.req.path) ? c.req.path : "unmatched";
    const asked = c.req.header("x-request-id");
    const valid = asked !== undefined && isValidRequestId(asked);
    const record = valid
      ? requestLog.record(asked, c.req.method, route)
      : requestLog.record(newRequestId(), c.req.method, route, true);
    records.set(c.req.raw, record);
    // Under OTEL_DENO this is Deno.serve's HTTP span; the llm.request span carries it too.
    trace.getActiveSpan()?.setAttribute("llm.request.id", record.id);
    if (asked !== undefined && !valid) {
      c.res = errorResponse(
        new ApiError(
          "invalid_request",
          `Invalid 'x-request-id' header: expected 1 to 128 visible ASCII characters, received ${
            JSON.stringify(asked.slice(0, 60))
          }`,
          "x-request-id",
        ),
        c.req.raw,
      );
    } else {
      await next();
    }
    try {
      c.res.headers.set("x-request-id", record.id);
    } catch {
      // A WebSocket upgrade's headers are immutable; the socket's frames carry ids instead.
    }
    metrics.httpRequests.inc({ method: c.req.method, route, status: String(c.res.status) });
    record.responded(c.res.status);
  });

  // Host and Origin before anything else, the open paths included: a rebinding page must not
  // read /metrics or load the playground under its own name either.
  app.use("*", async (c, next) => {
    const refusal = origins.check(c.req.header("host"), c.req.header("origin"));
    if (refusal !== null) {
      throw new ApiError(
        origins.hostAllowed(c.req.header("host") ?? "") ? "forbidden_origin" : "forbidden_host",
        refusal,
      );
    }
    await next();
  });
  // Listed cross-origin pages get CORS headers and their preflights answered.
  app.use(
    "*",
    cors({
      origin: (origin) => (origins.isListed(origin) ? origin : null),
      allowMethods: ["GET", "POST", "OPTIONS"],
      allowHeaders: ["authorization", "content-type", "x-request-id"],
      exposeHeaders: ["retry-after", "x-request-id"],
      maxAge: 600,
    }),
  );

  app.use("*", async (c, next) => {
    if (!keys.enabled || openPaths.has(c.req.path)) return await next();
    const auth = parseAuthorization(c.req.header("authorization"));
    let token = auth.kind === "token" ? auth.token : null;
    // Browsers cannot set headers on a WebSocket, so the socket may carry the key in its URL.
    if (auth.kind === "missing" && c.req.path === "/v1/stream") {
      token = c.req.query("api_key") ?? null;
    }
    if (!(await keys.verify(token))) {
      throw new ApiError(
        "unauthorized",
        auth.kind === "malformed"
          ? auth.problem
          : token === null
          ? "Missing API key: send the header 'Authorization: Bearer <key>'"
          : "Invalid API key",
      );
    }
    if (scopeByKey && token !== null) scopes.set(c.req.raw, await keyScope(token));
    await next();
  });

  app.get("/", (c) => c.html(PLAYGROUND_HTML));
  registerHealthRoutes(app, {
    backend,
    metrics,
    inflight,
    isLoaded: () => loaded,
    isDraining: () => draining,
  });
  const openAiOpts = {
    renderChat,
    maxBodyBytes: opts.maxBodyBytes ?? 1 << 20,
    defaultCompletionMaxTokens: opts.defaultCompletionMaxTokens ?? 16,
    createdAt: Math.floor(Date.now() / 1000),
    servedModelNames,
    recordOf: (req: Request) => records.get(req),
    scopeOf: (req: Request) => scopes.get(req),
    stallTimeoutMs: opts.wsStallTimeoutMs ?? 60_000,
  };
  registerOpenAiRoutes(app, deps, openAiOpts);
  const openAi = openAiHandler(deps, openAiOpts);
  opts.extend?.(app, {
    openAi,
    scopeOf: openAiOpts.scopeOf,
    maxBodyBytes: openAiOpts.maxBodyBytes,
  });
  registerTokenizeRoutes(app, {
    backend,
    renderChat,
    maxBodyBytes: opts.maxBodyBytes ?? 1 << 20,
    servedModelNames,
  });
  registerPropsRoute(app, {
    backend,
    servedModelNames,
    props: opts.props ?? {},
    limits: {
      max_body_bytes: opts.maxBodyBytes ?? 1 << 20,
      max_frame_bytes: sessionOpts.maxFrameBytes,
      max_generations_per_socket: sessionOpts.maxGenerationsPerSocket,
      default_completion_max_tokens: opts.defaultCompletionMaxTokens ?? 16,
    },
    isLoaded: () => loaded,
  });

  // Refusals of an upgrade go out as the status and headers alone (ws writes them on the raw
  // socket), so each has its own status.
  app.get("/v1/stream", async (c, next) => {
    if (c.req.header("upgrade")?.toLowerCase() !== "websocket") return await next();
    if (draining) {
      throw new ApiError(
        "draining",
        "The server is shutting down and accepts no new WebSockets; retry on another instance",
      );
    }
    // Without it node:http hands the request over as a plain one, on which the upgrade failed
    // with 500.
    const connection = c.req.header("connection") ?? "";
    if (!connection.split(",").some((t) => t.trim().toLowerCase() === "upgrade")) {
      throw new ApiError(
        "invalid_request",
        `A WebSocket upgrade needs the header 'Connection: Upgrade'; received ${
          JSON.stringify(connection.slice(0, 60) || "none")
        }`,
      );
    }
    const key = c.req.header("sec-websocket-key");
    if (key === undefined || !/^[A-Za-z0-9+/]{22}==$/.test(key)) {
      throw new ApiError(
        "invalid_request",
        `A WebSocket upgrade needs a Sec-WebSocket-Key of 16 base64 bytes; received ${
          key === undefined ? "none" : JSON.stringify(key.slice(0, 40))
        }`,
      );
    }
    if (c.req.header("sec-websocket-version") !== "13") {
      throw new ApiError(
        "upgrade_required",
        `Only WebSocket version 13 is supported; received ${
          JSON.stringify(c.req.header("sec-websocket-version") ?? "none")
        }`,
      );
    }
    const client = remoteAddress(c.env);
    if (client !== undefined && (socketsByClient.get(client) ?? 0) >= maxPerClient) {
      throw new ApiError(
        "too_many_connections",
        `This client already holds ${maxPerClient} WebSockets, the most one address may ` +
          "open; close one (several generations can share a socket)",
      );
    }
    await next();
  });
  app.get(
    "/v1/stream",
    upgradeWebSocket((c) => {
      let session: StreamSession | undefined;
      const client = remoteAddress(c.env);
      let counted = false;
      // The socket's generations log and trace as "<upgrade's request id>.<n>/<client id>".
      const sessionId = records.get(c.req.raw)?.id ?? `ws${++sessionCounter}`;
      const open = (ws: WSContext) => {
        if (session === undefined) {
          session = new StreamSession(
            deps,
            sessionOpts,
            frameSocket(ws),
            sessionId,
            scopes.get(c.req.raw),
          );
          sessions.add(session);
          if (client !== undefined) {
            counted = true;
            socketsByClient.set(client, (socketsByClient.get(client) ?? 0) + 1);
          }
        }
        return session;
      };
      return {
        onOpen: (_evt, ws) => void open(ws),
        onMessage: (evt, ws) => open(ws).onMessage(evt.data),
        onClose: () => {
          if (counted && client !== undefined) {
            counted = false;
            const n = (socketsByClient.get(client) ?? 1) - 1;
            if (n <= 0) socketsByClient.delete(client);
            else socketsByClient.set(client, n);
          }
          if (session === undefined) return;
          session.onClose();
          sessions.delete(session);
        },
      };
    }),
    () => {
      throw new ApiError(
        "upgrade_required",
        "GET /v1/stream is a WebSocket endpoint; connect with a WebSocket client " +
          "(header 'Upgrade: websocket')",
      );
    },
  );

  const hurried = new AbortController();
  const closeAll = () => {
    for (const s of sessions) s.close(CLOSE_GOING_AWAY, "server is shutting down");
    sessions.clear();
  };

  return {
    app,
    fetch: (req, info) => app.fetch(req, info as never),
    metrics,
    openAi,
    async adoptSocket(ws, upgrade, sessionId, client) {
      if (client !== undefined && (socketsByClient.get(client) ?? 0) >= maxPerClient) {
        const e = new ApiError(
          "too_many_connections",
          `This client already holds ${maxPerClient} WebSockets, the most one address may ` +
            "open; close one (several generations can share a socket)",
        );
        metrics.errors.inc({ code: e.code });
        ws.send(JSON.stringify({ type: "error", code: e.code, message: e.message }));
        ws.close(1008, "too many WebSockets from this client");
        return { onMessage() {}, onClose() {} };
      }
      if (client !== undefined) socketsByClient.set(client, (socketsByClient.get(client) ?? 0) + 1);
      let scope: string | undefined;
      if (keys.enabled && scopeByKey) {
        const auth = parseAuthorization(upgrade.headers.get("authorization"));
        const token = auth.kind === "token"
          ? auth.token
          : new URL(upgrade.url).searchParams.get("api_key");
        if (token !== null) scope = await keyScope(token);
      }
      const session = new StreamSession(deps, sessionOpts, frameSocket(ws), sessionId, scope);
      sessions.add(session);
      return {
        onMessage: (data) => session.onMessage(data),
        onClose: () => {
          if (client !== undefined) {
            const n = (socketsByClient.get(client) ?? 1) - 1;
            if (n <= 0) socketsByClient.delete(client);
            else socketsByClient.set(client, n);
          }
          session.onClose();
          sessions.delete(session);
        },
      };
    },
    async drain(d = {}) {
      draining = true;
      const completed = await inflight.whenIdle(
        d.timeoutMs ?? opts.drainTimeoutMs ?? 30_000,
        hurried.signal,
      );
      let aborted = 0;
      if (!completed) {
        aborted = inflight.abortAll("drain deadline passed");
        // Aborted generations end with a final event; give them a moment to send it (within
        // the second past the deadline that the drain may take).
        await inflight.whenIdle(500);
      }
      closeAll();
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
      return sessions.size;
    },
    close: closeAll,
  };
}

/** The client's address from @hono/node-server's env (absent under app.request in tests). */
function remoteAddress(env: unknown): string | undefined {
  const incoming = (env as { incoming?: { socket?: { remoteAddress?: string } } } | undefined)
    ?.incoming;
  return incoming?.socket?.remoteAddress;
}
