import type { MiddlewareHandler } from "hono";
import { trace } from "@opentelemetry/api";
import type { RequestRecords } from "./request_log_middleware.ts";

/**
 * Names the request id on the active HTTP span (under OTEL_DENO, Deno.serve's), so a trace
 * finds the log line and the other way round; the llm.request span of a generation carries it
 * too (tracked_generation.ts). Mounted outside the request log, which picks the id, and set
 * once the answer is made (the span ends after it is sent), so refusals carry it too.
 */
export function tracingMiddleware(records: RequestRecords): MiddlewareHandler {
  return async (c, next) => {
    const span = trace.getActiveSpan();
    await next();
    const id = records.of(c.req.raw)?.id;
    if (id !== undefined) span?.setAttribute("llm.request.id", id);
  };
}
