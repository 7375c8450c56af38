import type { MiddlewareHandler } from "hono";
import { type ApiKeyVerifier, keyScope, parseAuthorization } from "./auth.ts";
import { ApiError } from "./errors.ts";

export interface AuthOptions {
  readonly keys: ApiKeyVerifier;
  /** Paths served without a key. */
  readonly openPaths: ReadonlySet<string>;
  /** Give each key its own cache scope (--cache-scope key). */
  readonly scopeByKey: boolean;
}

/**
 * API-key authentication: a request off the open paths needs `Authorization: Bearer <key>`
 * (a WebSocket upgrade may carry it as `?api_key=`, since browsers cannot set headers on a
 * socket). With scopes by key it remembers each authenticated request's cache scope.
 */
/**
 * The request's API key, verified: `Authorization: Bearer <key>`, or on a WebSocket upgrade
 * (`/v1/stream`, where browsers cannot set headers) `?api_key=`. Throws 401 naming what was
 * wrong; returns the key (null when keys are off and none was sent).
 */
export async function verifiedKey(
  keys: ApiKeyVerifier,
  req: Request,
  path: string,
): Promise<string | null> {
  const auth = parseAuthorization(req.headers.get("authorization"));
  let token = auth.kind === "token" ? auth.token : null;
  // Anthropic's clients send the key as `x-api-key`.
  if (auth.kind === "missing") token = req.headers.get("x-api-key");
  if (token === null && auth.kind === "missing" && path === "/v1/stream") {
    token = new URL(req.url).searchParams.get("api_key");
  }
  if (!(await keys.verify(token))) {
    throw new ApiError(
      "unauthorized",
      auth.kind === "malformed"
        ? auth.problem
        : token === null
        ? "Missing API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>')"
        : "Invalid API key",
    );
  }
  return token;
}

export class ApiKeyAuth {
  readonly #o: AuthOptions;
  readonly #scopes = new WeakMap<Request, string>();
  readonly #tenants = new WeakMap<Request, string>();

  constructor(o: AuthOptions) {
    this.#o = o;
  }

  /** The cache scope of an authenticated request (with --cache-scope key). */
  scopeOf(req: Request): string | undefined {
    return this.#scopes.get(req);
  }

  /**
   * Whose keep-alive a request sets (a server of several models): its key's scope whatever
   * --cache-scope says; "" without keys.
   */
  tenantOf(req: Request): string {
    return this.#tenants.get(req) ?? "";
  }

  /** The facts about `from` now hold for `to`, which stands for it (body_limit.ts). */
  relink(from: Request, to: Request): void {
    const scope = this.#scopes.get(from);
    if (scope !== undefined) this.#scopes.set(to, scope);
    const tenant = this.#tenants.get(from);
    if (tenant !== undefined) this.#tenants.set(to, tenant);
  }

  /**
   * The cache scope of a WebSocket upgrade another app checked (the front of a server of
   * several models hands its sockets over): read from its key, header or `?api_key=`.
   */
  async scopeOfUpgrade(upgrade: Request): Promise<string | undefined> {
    if (!this.#o.keys.enabled || !this.#o.scopeByKey) return undefined;
    const token = await verifiedKey(this.#o.keys, upgrade, "/v1/stream");
    return token === null ? undefined : await keyScope(token);
  }

  middleware(): MiddlewareHandler {
    const { keys, openPaths, scopeByKey } = this.#o;
    return async (c, next) => {
      if (!keys.enabled || openPaths.has(c.req.path)) return await next();
      const token = await verifiedKey(keys, c.req.raw, c.req.path);
      if (token !== null) {
        const scope = await keyScope(token);
        this.#tenants.set(c.req.raw, scope);
        if (scopeByKey) this.#scopes.set(c.req.raw, scope);
      }
      await next();
    };
  }
}
