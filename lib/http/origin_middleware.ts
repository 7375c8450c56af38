import type { MiddlewareHandler } from "hono";
import { cors } from "hono/cors";
import { ApiError } from "./errors.ts";
import type { OriginPolicy } from "./origin.ts";

/**
 * Host and Origin checks, then CORS. The checks run before anything else, the open paths
 * included: a DNS-rebinding page must not read /metrics or load the playground under its own
 * name either. Listed cross-origin pages get CORS headers and their preflights answered.
 */
export function originMiddleware(origins: OriginPolicy): MiddlewareHandler[] {
  const check: MiddlewareHandler = async (c, next) => {
    const refusal = origins.check(c.req.header("host"), c.req.header("origin"));
    if (refusal !== null) {
      throw new ApiError(
        origins.hostAllowed(c.req.header("host") ?? "") ? "forbidden_origin" : "forbidden_host",
        refusal,
      );
    }
    await next();
  };
  return [
    check,
    cors({
      origin: (origin) => (origins.isListed(origin) ? origin : null),
      allowMethods: ["GET", "POST", "OPTIONS"],
      allowHeaders: ["authorization", "content-type", "x-request-id"],
      exposeHeaders: ["retry-after", "x-request-id"],
      maxAge: 600,
    }),
  ];
}
