import type { Hono } from "hono";
import { ApiError, toApiError } from "./errors.ts";
import { errorBody } from "./error_shapes.ts";
import type { RequestRecords } from "./request_log_middleware.ts";
import type { RouteTable } from "./route_table.ts";
import type { ServiceMetrics } from "./service_metrics.ts";

export interface ErrorMappingOptions {
  readonly metrics: ServiceMetrics;
  readonly records: RequestRecords;
  readonly routes: RouteTable;
  /** Retry-After seconds on 503 (overloaded, draining) and 429 (too many at once). */
  readonly retryAfterSeconds: number;
}

/** Retry-After seconds of an error other than the configured ones; null: none. */
const retryAfterOf = new WeakMap<ApiError, number | null>();

/**
 * `e`, answered with Retry-After `seconds`, or none for null (waiting will not help: memory
 * held by models kept forever, a model that cannot load).
 */
export function withRetryAfter(e: ApiError, seconds: number | null): ApiError {
  retryAfterOf.set(e, seconds);
  return e;
}

/** Answers an ApiError: its JSON body, status and the headers its code calls for. */
export type ErrorResponder = (e: ApiError, req: Request) => Response;

/**
 * The one place an error becomes a response: counted in llm_errors_total, its code put on the
 * request's log record, and the headers it needs (Retry-After on 503 and 429, WWW-Authenticate on
 * 401, Sec-WebSocket-Version on 426, Allow on 405 from the route table).
 */
export function errorResponder(o: ErrorMappingOptions): ErrorResponder {
  const retryAfter = String(o.retryAfterSeconds);
  return (e, req) => {
    o.metrics.errors.inc({ code: e.code });
    const record = o.records.of(req);
    if (record) record.code = e.code;
    const headers: Record<string, string> = {};
    const seconds = retryAfterOf.has(e) ? retryAfterOf.get(e) : retryAfter;
    if ((e.status === 503 || e.status === 429) && seconds != null) {
      headers["retry-after"] = String(seconds);
    }
    if (e.status === 401) headers["www-authenticate"] = 'Bearer realm="llmserve"';
    if (e.code === "upgrade_required") headers["sec-websocket-version"] = "13";
    if (e.code === "method_not_allowed") {
      const allow = o.routes.allowed(new URL(req.url).pathname);
      if (allow !== undefined) headers["allow"] = allow;
    }
    return Response.json(errorBody(e, new URL(req.url).pathname), { status: e.status, headers });
  };
}

/**
 * Maps whatever a handler or middleware throws through `respond`, and answers a request no
 * route took: 405 with Allow when the path is a route under other methods, else 404.
 */
export function installErrorMapping(app: Hono, respond: ErrorResponder, routes: RouteTable): void {
  app.onError((err, c) => respond(toApiError(err), c.req.raw));
  app.notFound((c) => respond(unroutedError(c.req.method, c.req.path, routes), c.req.raw));
}

/** A request no route takes: 405 naming the methods when the path is a route, else 404. */
export function unroutedError(method: string, path: string, routes: RouteTable): ApiError {
  const allow = routes.allowed(path);
  return allow === undefined
    ? new ApiError("not_found", `No route for ${method} ${path}`)
    : new ApiError("method_not_allowed", `${path} does not take ${method}; use ${allow}`);
}
