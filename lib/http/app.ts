import { Hono } from "hono";
import { upgradeWebSocket } from "hono/deno";
import type { WSContext } from "hono/ws";
import { trace, type Tracer } from "@opentelemetry/api";
import type { GenerationBackend } from "../core/generation.ts";
import { ApiKeyVerifier, bearerToken } from "./auth.ts";
import { createChatRenderer } from "./chat_template.ts";
import { ApiError, toApiError } from "./errors.ts";
import type { FrameSocket } from "./frame_writer.ts";
import { registerHealthRoutes } from "./health_routes.ts";
import { InFlightRegistry } from "./inflight.ts";
import { registerOpenAiRoutes } from "./openai_routes.ts";
import { PLAYGROUND_HTML } from "./playground.html.ts";
import { ServiceMetrics } from "./service_metrics.ts";
import type { GenerationDeps } from "./tracked_generation.ts";
import { CLOSE_GOING_AWAY, StreamSession } from "./ws_session.ts";

export interface AppOptions {
  readonly backend: GenerationBackend;
  /** Accepted bearer tokens; empty or absent turns authentication off. */
  readonly apiKeys?: readonly string[];
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
  /** A socket congested this long is closed with 1008 (default 60 s). */
  readonly wsStallTimeoutMs?: number;
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
}

export interface DrainResult {
  /** True when every in-flight generation finished before the deadline. */
  readonly completed: boolean;
  /** Generations aborted at the deadline. */
  readonly aborted: number;
}

export interface ServiceApp {
  readonly app: Hono;
  /** Pass to Deno.serve. */
  readonly fetch: (req: Request, info?: unknown) => Response | Promise<Response>;
  readonly metrics: ServiceMetrics;
  /**
   * Stops new generations (503 "draining", /ready 503), waits for in-flight ones up to
   * `timeoutMs`, aborts what is left, then closes WebSockets with 1001.
   */
  drain(opts?: { timeoutMs?: number }): Promise<DrainResult>;
  setReady(ready: boolean): void;
  readonly draining: boolean;
  /** Generations open over HTTP and WebSocket. */
  readonly inFlight: number;
  /** Open WebSocket sessions. */
  readonly sockets: number;
  /** Closes every WebSocket and stops timers (after drain, or in tests). */
  close(): void;
}

/** Routes that get their own label in llm_http_requests_total (others are "unmatched"). */
const ROUTES = new Set([
  "/",
  "/health",
  "/ready",
  "/metrics",
  "/v1/stream",
  "/v1/models",
  "/v1/completions",
  "/v1/chat/completions",
]);

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
  const openPaths = new Set(opts.openPaths ?? ["/", "/health", "/ready"]);
  const retryAfter = String(opts.retryAfterSeconds ?? 1);
  const renderChat = createChatRenderer({
    template: backend.chatTemplate,
    bosToken: backend.bosToken,
    eosToken: backend.eosToken,
    specialTokens: backend.specialTokens ?? [],
  });
  let loaded = opts.ready ?? true;
  let draining = false;
  const sessions = new Set<StreamSession>();
  let sessionCounter = 0;

  const deps: GenerationDeps = {
    backend,
    metrics,
    tracer,
    inflight,
    isDraining: () => draining,
  };
  const highWater = opts.wsHighWaterBytes ?? 1 << 20;
  const sessionOpts = {
    renderChat,
    maxFrameBytes: opts.maxFrameBytes ?? 256 * 1024,
    maxGenerationsPerSocket: opts.maxGenerationsPerSocket ?? 64,
    statsIntervalMs: opts.statsIntervalMs ?? 500,
    writer: {
      highWaterBytes: highWater,
      lowWaterBytes: opts.wsLowWaterBytes ?? Math.floor(highWater / 4),
      stallTimeoutMs: opts.wsStallTimeoutMs ?? 60_000,
    },
  };

  const app = new Hono();

  app.onError((err, c) => {
    const e = toApiError(err);
    metrics.errors.inc({ code: e.code });
    if (e.status === 503) c.header("retry-after", retryAfter);
    if (e.status === 401) c.header("www-authenticate", 'Bearer realm="llmserve"');
    return c.json(e.toJSON(), e.status as 400);
  });
  app.notFound((c) => {
    const e = new ApiError("not_found", `No route for ${c.req.method} ${c.req.path}`);
    metrics.errors.inc({ code: e.code });
    return c.json(e.toJSON(), 404);
  });

  app.use("*", async (c, next) => {
    await next();
    metrics.httpRequests.inc({
      method: c.req.method,
      route: ROUTES.has(c.req.path) ? c.req.path : "unmatched",
      status: String(c.res.status),
    });
  });

  app.use("*", async (c, next) => {
    if (!keys.enabled || openPaths.has(c.req.path)) return await next();
    let token = bearerToken(c.req.header("authorization"));
    // Browsers cannot set headers on a WebSocket, so the socket may carry the key in its URL.
    if (token === null && c.req.path === "/v1/stream") token = c.req.query("api_key") ?? null;
    if (!(await keys.verify(token))) {
      throw new ApiError(
        "unauthorized",
        token === null
          ? "Missing API key: send the header 'Authorization: Bearer <key>'"
          : "Invalid API key",
      );
    }
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
  registerOpenAiRoutes(app, deps, {
    renderChat,
    maxBodyBytes: opts.maxBodyBytes ?? 1 << 20,
    defaultCompletionMaxTokens: opts.defaultCompletionMaxTokens ?? 16,
    createdAt: Math.floor(Date.now() / 1000),
  });

  app.get(
    "/v1/stream",
    upgradeWebSocket(() => {
      let session: StreamSession | undefined;
      const open = (ws: WSContext) => {
        if (session === undefined) {
          session = new StreamSession(deps, sessionOpts, frameSocket(ws), `ws${++sessionCounter}`);
          sessions.add(session);
        }
        return session;
      };
      return {
        onOpen: (_evt, ws) => void open(ws),
        onMessage: (evt, ws) => open(ws).onMessage(evt.data),
        onClose: () => {
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

  const closeAll = () => {
    for (const s of sessions) s.close(CLOSE_GOING_AWAY, "server is shutting down");
    sessions.clear();
  };

  return {
    app,
    fetch: (req, info) => app.fetch(req, info),
    metrics,
    async drain(d = {}) {
      draining = true;
      const completed = await inflight.whenIdle(d.timeoutMs ?? opts.drainTimeoutMs ?? 30_000);
      let aborted = 0;
      if (!completed) {
        aborted = inflight.abortAll("drain deadline passed");
        // Aborted generations end with a final event; give them a moment to send it.
        await inflight.whenIdle(1000);
      }
      closeAll();
      return { completed, aborted };
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
