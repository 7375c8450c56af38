import type { MiddlewareHandler } from "hono";
import { ApiError } from "./errors.ts";
import {
  isValidRequestId,
  newRequestId,
  type RequestLog,
  type RequestRecord,
} from "./request_log.ts";
import type { RouteTable } from "./route_table.ts";

/** Each request's log record, for the routes and the other middleware. */
export class RequestRecords {
  readonly #byRequest = new WeakMap<Request, RequestRecord>();

  of(req: Request): RequestRecord | undefined {
    return this.#byRequest.get(req);
  }

  set(req: Request, record: RequestRecord): void {
    this.#byRequest.set(req, record);
  }

  /** `to` stands for `from` (the body limit's buffered copy): the same record. */
  relink(from: Request, to: Request): void {
    const record = this.#byRequest.get(from);
    if (record !== undefined) this.#byRequest.set(to, record);
  }
}

export interface RequestLogMiddlewareOptions {
  readonly log: RequestLog;
  readonly records: RequestRecords;
  readonly routes: RouteTable;
  /** How a refusal is answered (the error mapping: counts it, sets its headers). */
  readonly refuse: (e: ApiError, req: Request) => Response;
}

/**
 * Request id and request log: takes the client's `x-request-id` (or makes one up), opens the
 * request's record under its route label, names the id on the response and writes the line
 * when the response is done. A malformed `x-request-id` is refused with 400. Mounted before
 * the refusing middleware so that its line covers every answer, refusals included.
 */
export function requestLogMiddleware(o: RequestLogMiddlewareOptions): MiddlewareHandler {
  return async (c, next) => {
    const route = o.routes.label(c.req.method, c.req.path);
    const asked = c.req.header("x-request-id");
    const valid = asked !== undefined && isValidRequestId(asked);
    const record = valid
      ? o.log.record(asked, c.req.method, route)
      : o.log.record(newRequestId(), c.req.method, route, true);
    if (route === "unmatched") record.path = c.req.path;
    o.records.set(c.req.raw, record);
    if (asked !== undefined && !valid) {
      c.res = o.refuse(
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
    record.responded(c.res.status);
  };
}
