import { Hono } from "hono";
import { HTTP_DEFAULTS } from "./defaults.ts";
import { ApiKeyVerifier } from "./auth.ts";
import { ApiKeyAuth } from "./auth_middleware.ts";
import { jsonBodyLimit } from "./body_limit.ts";
import { type ErrorResponder, errorResponder, installErrorMapping } from "./error_mapping.ts";
import { httpMetricsMiddleware } from "./http_metrics_middleware.ts";
import { OriginPolicy } from "./origin.ts";
import { originMiddleware } from "./origin_middleware.ts";
import { RequestLog } from "./request_log.ts";
import { requestLogMiddleware, RequestRecords } from "./request_log_middleware.ts";
import { RouteTable } from "./route_table.ts";
import type { ServiceMetrics } from "./service_metrics.ts";
import { tracingMiddleware } from "./tracing_middleware.ts";

/** The front door's settings; createApp's options (app.ts) take them as they are. */
export interface FrontDoorOptions {
  readonly metrics: ServiceMetrics;
  /** Where request-log lines go; default text lines on stderr. */
  readonly requestLog?: RequestLog;
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
  /** Serve /metrics without an API key (so Prometheus can scrape it). Default false. */
  readonly metricsPublic?: boolean;
  /** HTTP request body limit. */
  readonly maxBodyBytes: number;
  /** Retry-After seconds on 503 (overloaded, draining) and 429 (default 1). */
  readonly retryAfterSeconds?: number;
}

/** A Hono app with the front door's middleware and error mapping, for the routes to be added. */
export interface FrontDoor {
  readonly app: Hono;
  /** Hono's own table of the app's routes (labels, 404 and 405 with Allow). */
  readonly routes: RouteTable;
  readonly records: RequestRecords;
  /** The one error-to-response function (error_mapping.ts). */
  readonly respond: ErrorResponder;
  readonly auth: ApiKeyAuth;
  /** The HTTP body limit. */
  readonly maxBodyBytes: number;
}

/**
 * The middleware every front shares (one model, several, a router), outermost first: request
 * counter (http_metrics_middleware.ts), tracing (tracing_middleware.ts), request id and log
 * (request_log_middleware.ts), Host/Origin and CORS (origin_middleware.ts), API keys
 * (auth_middleware.ts), the JSON body limit (body_limit.ts); error_mapping.ts turns what any of
 * them or a route throws into the answer. Every route label and 405 comes from one route
 * table, hono's own (route_table.ts).
 */
export function frontDoor(o: FrontDoorOptions): FrontDoor {
  const app = new Hono();
  const routes = new RouteTable(() => app.routes);
  const records = new RequestRecords();
  const respond = errorResponder({
    metrics: o.metrics,
    records,
    routes,
    retryAfterSeconds: o.retryAfterSeconds ?? HTTP_DEFAULTS.retryAfterSeconds,
  });
  installErrorMapping(app, respond, routes);
  const openPaths = new Set(o.openPaths ?? HTTP_DEFAULTS.openPaths);
  if (o.metricsPublic === true) openPaths.add("/metrics");
  const auth = new ApiKeyAuth({
    keys: new ApiKeyVerifier(o.apiKeys ?? []),
    openPaths,
    scopeByKey: o.cacheScope !== "global",
  });
  app.use(
    "*",
    httpMetricsMiddleware(o.metrics, routes, records),
    tracingMiddleware(records),
    requestLogMiddleware({
      log: o.requestLog ?? new RequestLog(),
      records,
      routes,
      refuse: respond,
    }),
    ...originMiddleware(new OriginPolicy(o.corsOrigins ?? [], o.allowedHosts ?? [])),
    auth.middleware(),
    jsonBodyLimit(o.maxBodyBytes, routes, (from, to) => {
      records.relink(from, to);
      auth.relink(from, to);
    }),
  );
  return { app, routes, records, respond, auth, maxBodyBytes: o.maxBodyBytes };
}
