import type { MiddlewareHandler } from "hono";
import { bodyLimit } from "hono/body-limit";
import { bodyEnded, drainRefusedBody, isJsonMedia, rebuilt, tooLarge } from "./body.ts";
import { ApiError } from "./errors.ts";
import type { RouteTable } from "./route_table.ts";

/**
 * The HTTP body limit of JSON requests, hono's: a body whose Content-Length passes `maxBytes` is
 * refused with 413 before any route reads it, and a chunked one as soon as its bytes pass it (on
 * every route, the ones mounted by `extend` and a front's model routes included). Other media
 * (the batch queue's multipart file upload, with its own limit) pass; so do requests no route
 * takes (they get 404/405).
 *
 * Hono buffers a chunked body and puts a new Request in its place: `relink` tells the earlier
 * middleware, which keep facts by request (its log record, its key's scope), about the new one.
 */
export function jsonBodyLimit(
  maxBytes: number,
  routes: RouteTable,
  relink: (from: Request, to: Request) => void,
): MiddlewareHandler {
  const limit = bodyLimit({
    maxSize: maxBytes,
    onError: async (c) => {
      const declared = Number(c.req.header("content-length") ?? "NaN");
      if (Number.isFinite(declared) && c.req.header("transfer-encoding") === undefined) {
        await drainRefusedBody(c.req.raw.body);
        throw tooLarge(declared, maxBytes);
      }
      throw tooLarge(maxBytes, maxBytes, true);
    },
  });
  return async (c, next) => {
    if (
      !isJsonMedia(c.req.header("content-type")) ||
      routes.patternFor(c.req.method, c.req.path) === undefined
    ) {
      return await next();
    }
    const received = c.req.raw;
    // A chunked body is buffered into a copy of the request, which hono makes with the Request
    // constructor: the server adapter's request is none it takes, this runtime's own is.
    if (!c.req.raw.headers.has("content-length") || c.req.raw.headers.has("transfer-encoding")) {
      c.req.raw = rebuilt(received);
    }
    try {
      await limit(c, async () => {
        if (c.req.raw !== received) relink(received, c.req.raw);
        await next();
      });
    } catch (err) {
      // Past next(), hono maps what a route throws; what gets here is the limit's own reading.
      throw err instanceof ApiError ? err : bodyEnded(received);
    }
  };
}
