import type { MiddlewareHandler } from "hono";
import { tooLarge } from "./body.ts";
import type { RouteTable } from "./route_table.ts";

/**
 * The HTTP body limit of JSON requests: a JSON body whose Content-Length passes `maxBytes` is
 * refused with 413 before any route reads it (on every route, the ones mounted by `extend`
 * included). readJsonBody() (body.ts) holds routes to the same limit on the bytes actually
 * streamed, for a chunked or lying client. Other media (the batch queue's multipart file
 * upload, with its own limit) pass; so do requests no route takes (they get 404/405).
 */
export function jsonBodyLimit(maxBytes: number, routes: RouteTable): MiddlewareHandler {
  return async (c, next) => {
    const media = (c.req.header("content-type") ?? "").split(";")[0]!.trim().toLowerCase();
    if (media === "application/json") {
      const declared = Number(c.req.header("content-length") ?? "NaN");
      if (
        Number.isFinite(declared) && declared > maxBytes &&
        routes.patternFor(c.req.method, c.req.path) !== undefined
      ) {
        throw tooLarge(declared, maxBytes);
      }
    }
    await next();
  };
}
