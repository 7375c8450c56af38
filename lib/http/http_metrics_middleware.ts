import type { MiddlewareHandler } from "hono";
import type { RequestRecords } from "./request_log_middleware.ts";
import type { RouteTable } from "./route_table.ts";
import type { ServiceMetrics } from "./service_metrics.ts";

/**
 * Counts every answer in llm_http_requests_total by method, route label and status. Mounted
 * first, so refusals of every later middleware (host, origin, key, request id) are counted.
 * A request passed on to another app (a model's, behind a front) is counted there.
 */
export function httpMetricsMiddleware(
  metrics: ServiceMetrics,
  routes: RouteTable,
  records: RequestRecords,
): MiddlewareHandler {
  return async (c, next) => {
    await next();
    if (records.of(c.req.raw)?.passedOn) return;
    metrics.httpRequests.inc({
      method: c.req.method,
      route: routes.label(c.req.method, c.req.path),
      status: String(c.res.status),
    });
  };
}
