/**
 * The front of a plain router (`deno task router` without `--by-model`): its own model (the
 * first one a replica told it, served by its RouterBackend's app, as before) answers every
 * request that names it, one of its aliases, or no model, and everything about the router
 * (/health, /ready, /metrics, the playground). A request naming another model that replicas
 * advertise (a replica of several models serves more than its first) goes to that model's app
 * from a {@link ModelRouterDirectory}, which routes it by the router's policy among the
 * replicas serving it; a model no replica serves is a 404 naming every served one.
 */
import { type AppOptions, createApp, type DrainResult, type ServiceApp } from "../http/app.ts";
import type { OpenAiHandler } from "../http/openai_routes.ts";
import { ApiKeyVerifier } from "../http/auth.ts";
import { verifiedKey } from "../http/auth_middleware.ts";
import { HTTP_DEFAULTS } from "../http/defaults.ts";
import { ApiError, preview, toApiError } from "../http/errors.ts";
import type { ServiceMetrics } from "../http/service_metrics.ts";
import { ModelLoadError } from "../compose/model_pool.ts";
import { BODY_ROUTES, objectBody, readCapped, rebuilt } from "../compose/models_service.ts";
import { ModelRouterDirectory, type ModelRouterOptions } from "./model_router.ts";
import type { BusConnection } from "./nats_connection.ts";
import type { RouterBackend } from "./router_backend.ts";

/**
 * A plain router's service over its started RouterBackend: the app over that backend (its own
 * model), a directory of the other models replicas advertise, and the front between them.
 */
export function createPlainRouter(
  nc: BusConnection,
  backend: RouterBackend,
  opts: ModelRouterOptions & {
    readonly metrics: ServiceMetrics;
    /** Routes mounted beside the API (the Batch API); their completions are routed as requests. */
    readonly extend?: AppOptions["extend"];
  },
): { service: ServiceApp; directory: ModelRouterDirectory } {
  const { metrics, extend, ...routing } = opts;
  const primaryNames = [backend.modelName];
  const directory = new ModelRouterDirectory(nc, {
    ...routing,
    servedElsewhere: (name) => name === backend.modelName,
  });
  const primary = createApp({
    backend,
    metrics,
    servedModelNames: primaryNames,
    ...(opts.apiKeys === undefined ? {} : { apiKeys: opts.apiKeys }),
    ...(opts.cacheScope === undefined ? {} : { cacheScope: opts.cacheScope }),
    ...(opts.drainTimeoutMs === undefined ? {} : { drainTimeoutMs: opts.drainTimeoutMs }),
    ...(extend === undefined ? {} : {
      extend: (app, ctx) =>
        extend(app, { ...ctx, openAi: routedOpenAi(ctx.openAi, primaryNames, directory) }),
    }),
  });
  const service = createRouterFront({
    primary,
    model: backend.modelName,
    primaryNames,
    directory,
    ...(opts.apiKeys === undefined ? {} : { apiKeys: opts.apiKeys }),
  });
  return { service, directory };
}

/**
 * A completion of the router's own routes (a batch line), run as the front runs a request: on
 * the primary's app (its model, spread over its replicas) or on the app of the other model the
 * body names, over that model's replicas.
 */
function routedOpenAi(
  primary: OpenAiHandler,
  primaryNames: readonly string[],
  directory: ModelRouterDirectory,
): OpenAiHandler {
  return async (req, kind, scope) => {
    const text = await req.text();
    const asked = objectBody(text)?.model;
    if (typeof asked !== "string" || primaryNames.includes(asked)) {
      return await primary(rebuilt(req, text), kind, scope);
    }
    const name = directory.resolve(asked);
    if (name === undefined || !directory.has(name)) {
      throw new ApiError(
        "model_not_found",
        `The model ${preview(asked)} does not exist; no replica serves it`,
        "model",
      );
    }
    let lease;
    try {
      lease = await directory.acquire(name);
    } catch (e) {
      if (e instanceof ModelLoadError) throw new ApiError("model_load_failed", e.message, "model");
      throw e;
    }
    try {
      const run = lease.model.service.openAi;
      if (run === undefined) throw new Error(`the route of model "${name}" runs no completions`);
      const res = await run(rebuilt(req, text), kind, scope);
      return new Response(await res.arrayBuffer(), { status: res.status, headers: res.headers });
    } finally {
      lease.release();
    }
  };
}

export interface RouterFrontOptions {
  /** The app over the router's own RouterBackend. */
  readonly primary: ServiceApp;
  /** Its model's name (the backend's). */
  readonly model: string;
  /**
   * The names the primary app accepts (its servedModelNames, read at each request): the front
   * adds the aliases replicas advertise for its model.
   */
  readonly primaryNames: string[];
  /** Every model the replicas advertise; built with servedElsewhere naming `model`. */
  readonly directory: ModelRouterDirectory;
  readonly apiKeys?: readonly string[];
  readonly maxBodyBytes?: number;
}

export function createRouterFront(o: RouterFrontOptions): ServiceApp {
  const { primary, directory } = o;
  const keys = new ApiKeyVerifier(o.apiKeys ?? []);
  const maxBodyBytes = o.maxBodyBytes ?? HTTP_DEFAULTS.maxBodyBytes;
  const createdAt = Math.floor(Date.now() / 1000);
  const tooLarge = (bytes: number) =>
    new ApiError(
      "payload_too_large",
      `Request body of ${bytes} bytes is over the limit of ${maxBodyBytes} bytes`,
    );

  /** The primary's names, with the aliases its model's replicas advertise now. */
  const primaryNames = (): string[] => {
    for (const alias of directory.aliasesOf(o.model)) {
      if (!o.primaryNames.includes(alias) && directory.resolve(alias) === o.model) {
        o.primaryNames.push(alias);
      }
    }
    return o.primaryNames;
  };
  const others = () => directory.catalog().filter((m) => !primaryNames().includes(m.name));
  const served = () =>
    [...primaryNames(), ...others().flatMap((m) => [m.name, ...(m.aliases ?? [])])].map((n) =>
      `"${n}"`
    )
      .join(", ");

  /** 404 for a model no replica serves, after the key check: the answer names the served ones. */
  const notFound = async (req: Request, path: string, asked: unknown): Promise<never> => {
    if (keys.enabled) await verifiedKey(keys, req, path);
    throw new ApiError(
      "model_not_found",
      `The model ${preview(asked)} does not exist; this router serves ${served()}`,
      "model",
    );
  };

  /** The app for the model a request names: the primary's, another model's, or a 404. */
  const appFor = async (req: Request, path: string, asked: unknown): Promise<ServiceApp> => {
    // No model, or one that is no string: the primary answers (or says what is wrong).
    if (typeof asked !== "string" || primaryNames().includes(asked)) return primary;
    const name = directory.resolve(asked);
    if (name === undefined || !directory.has(name)) return await notFound(req, path, asked);
    try {
      return (await directory.acquire(name)).model.service;
    } catch (e) {
      if (e instanceof ModelLoadError) throw new ApiError("model_load_failed", e.message, "model");
      throw e;
    }
  };

  /** /v1/models/<id> of another model, from the heartbeats (without building its route). */
  const describeOther = async (req: Request, path: string, asked: string): Promise<Response> => {
    const m = others().find((x) => x.name === directory.resolve(asked));
    if (m === undefined) return await notFound(req, path, asked);
    if (keys.enabled) await verifiedKey(keys, req, path);
    return Response.json(entry(asked, m.name, createdAt, m.contextLength));
  };

  /** /v1/models: the primary's list (its key check, its entries), then the other models. */
  const listModels = async (req: Request, info: unknown): Promise<Response> => {
    const res = await primary.fetch(req, info);
    if (res.status !== 200) return res;
    const body = await res.json() as { object: string; data: Record<string, unknown>[] };
    for (const m of others()) {
      for (const id of [m.name, ...(m.aliases ?? [])]) {
        body.data.push(entry(id, m.name, createdAt, m.contextLength));
      }
    }
    const headers = new Headers(res.headers);
    headers.delete("content-length");
    return Response.json(body, { status: 200, headers });
  };

  const fetch = async (req: Request, info?: unknown): Promise<Response> => {
    const path = new URL(req.url).pathname;
    primaryNames();
    try {
      if (req.method === "POST" && BODY_ROUTES.has(path)) {
        const length = Number(req.headers.get("content-length") ?? "0");
        if (length > maxBodyBytes) throw tooLarge(length);
        const text = await readCapped(req, maxBodyBytes, tooLarge);
        // Not a JSON object: the primary says what is wrong with it.
        const asked = objectBody(text)?.model;
        return await (await appFor(req, path, asked)).fetch(rebuilt(req, text), info);
      }
      if (req.method === "GET" && path === "/v1/models") return await listModels(req, info);
      if (req.method === "GET" && path.startsWith("/v1/models/")) {
        const asked = decodeURIComponent(path.slice("/v1/models/".length));
        if (primaryNames().includes(asked)) return await primary.fetch(req, info);
        return await describeOther(req, path, asked);
      }
      // A WebSocket, the playground, /props, /health and the rest: ?model= picks, else the primary.
      const asked = new URL(req.url).searchParams.get("model");
      return await (await appFor(req, path, asked ?? undefined)).fetch(req, info);
    } catch (err) {
      const e = err instanceof ApiError ? err : toApiError(err);
      primary.metrics.errors.inc({ code: e.code });
      const headers: Record<string, string> = {};
      if (e.status === 401) headers["www-authenticate"] = 'Bearer realm="llmserve"';
      if (e.status === 503) headers["retry-after"] = "1";
      return Response.json(e.toJSON(), { status: e.status, headers });
    }
  };

  const all = () => [primary, ...directory.loaded().map((m) => m.service)];
  return {
    get app() {
      return primary.app;
    },
    fetch,
    metrics: primary.metrics,
    async drain(d = {}): Promise<DrainResult> {
      const results = await Promise.all(all().map((s) => s.drain(d)));
      return {
        completed: results.every((r) => r.completed),
        aborted: results.reduce((n, r) => n + r.aborted, 0),
      };
    },
    hurry: () => all().forEach((s) => s.hurry()),
    setReady: (ready) => primary.setReady(ready),
    get draining() {
      return primary.draining;
    },
    get inFlight() {
      return all().reduce((n, s) => n + s.inFlight, 0);
    },
    get sockets() {
      return all().reduce((n, s) => n + s.sockets, 0);
    },
    close: () => all().forEach((s) => s.close()),
  };
}

/** A /v1/models entry for another model, in the shape the primary's app gives its own. */
function entry(id: string, root: string, created: number, contextLength: number | undefined) {
  return {
    id,
    object: "model",
    created,
    owned_by: "llmserve",
    root,
    ...(contextLength === undefined ? {} : { max_model_len: contextLength }),
  };
}
