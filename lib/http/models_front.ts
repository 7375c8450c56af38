/**
 * The front of a server of several models, and of a router by model: createApp's front door
 * (front_door.ts) with, behind it, the catalog's routes (/v1/models, /health, /ready,
 * /metrics: about all models) and, on every route of a model's app, the model dispatch: the
 * request goes whole to the app of the model it names (its own, over its own engine), loaded
 * first through the pool.
 */
import type { Context, Hono } from "hono";
import type { AppContext, DrainResult, ServiceApp } from "./app.ts";
import { appRoutes } from "./app_routes.ts";
import { ApiKeyVerifier } from "./auth.ts";
import { HTTP_DEFAULTS } from "./defaults.ts";
import { ApiError } from "./errors.ts";
import { frontDoor } from "./front_door.ts";
import { findModel, namesOf, registerModelRoutes, unknownModel } from "./model_catalog.ts";
import type { CatalogModel, ModelDirectory } from "./model_directory.ts";
import { rebuilt } from "./body.ts";
import { askedModel, dispatchedOpenAi, leased, leasedOpenAi, passOn } from "./model_dispatch.ts";
import { registerOllamaListings } from "./ollama_routes.ts";
import { loadingSocket, loadingStream } from "./model_loading.ts";
import { registerModelsHealthRoutes } from "./models_health_routes.ts";
import type { RequestLog } from "./request_log.ts";
import type { ServiceMetrics } from "./service_metrics.ts";
import { parseKeepAlive } from "../util/duration.ts";
import { DRAINING_MESSAGE } from "../core/draining.ts";

export interface ModelsFrontOptions {
  readonly pool: ModelDirectory;
  /** What /v1/models lists, first the default model (a function where it changes). */
  readonly catalog: readonly CatalogModel[] | (() => readonly CatalogModel[]);
  /** Serves /metrics' connection counters (serveService writes them). */
  readonly metrics: ServiceMetrics;
  /** Each model's registry, kept across its loads; each load's app writes to it. */
  readonly modelMetrics: ReadonlyMap<string, ServiceMetrics>;
  readonly apiKeys?: readonly string[];
  readonly metricsPublic?: boolean;
  readonly corsOrigins?: readonly string[];
  readonly allowedHosts?: readonly string[];
  readonly requestLog?: RequestLog;
  readonly maxBodyBytes?: number;
  readonly drainTimeoutMs?: number;
  /** As createApp's: who shares cached work (the batch routes' files and batches too). */
  readonly cacheScope?: "key" | "global";
  /** Routes for every model (the batch queue): `openAi` runs each on the model its body names. */
  readonly extend?: (app: Hono, ctx: AppContext) => void;
}

export function createModelsFront(opts: ModelsFrontOptions): ServiceApp {
  const { pool, metrics } = opts;
  const maxBodyBytes = opts.maxBodyBytes ?? HTTP_DEFAULTS.maxBodyBytes;
  const door = frontDoor({ ...opts, maxBodyBytes });
  const { app, records, auth } = door;
  const catalog = () => typeof opts.catalog === "function" ? opts.catalog() : opts.catalog;
  let draining = false;
  /** Requests between arriving and their model's answer being passed on (loads included). */
  let routing = 0;

  /** The model a request names (none: the default), or the 404 naming every served one. */
  const resolve = (asked: unknown): string => {
    const all = catalog();
    if (asked === undefined || asked === null) return all[0]?.name ?? "";
    // Ollama's clients may add its default tag (ollama_request.ts servedOllamaName).
    const m = typeof asked === "string"
      ? findModel(all, asked) ?? findModel(all, asked.replace(/:latest$/, ""))
      : undefined;
    if (m !== undefined && pool.has(m.name)) return m.name;
    throw unknownModel(asked, all.filter((c) => pool.has(c.name)).flatMap(namesOf));
  };
  /** The body to pass on: the client's, less `keep_alive`, which is the front's. */
  const choose = (fields: Record<string, unknown> | undefined) => {
    // Not a JSON object: the default model's app says what is wrong with it.
    if (fields === undefined) return { name: resolve(undefined) };
    const name = resolve(fields.model);
    if (!("keep_alive" in fields)) return { name };
    const k = parseKeepAlive(fields.keep_alive);
    if (typeof k === "string") {
      throw new ApiError("invalid_request", `Invalid 'keep_alive': ${k}`, "keep_alive");
    }
    const { keep_alive: _, ...rest } = fields;
    return { name, keepAliveMs: k, body: JSON.stringify(rest) };
  };

  registerModelsHealthRoutes(app, {
    pool,
    metrics,
    modelMetrics: opts.modelMetrics,
    keys: new ApiKeyVerifier(opts.apiKeys ?? []),
    isDraining: () => draining,
  });
  registerModelRoutes(app, {
    catalog: () => catalog().filter((m) => pool.has(m.name)),
    createdAt: Math.floor(Date.now() / 1000),
    phaseOf: (name) => pool.phaseOf(name),
  });
  registerOllamaListings(app, {
    models: () =>
      catalog().filter((m) => pool.has(m.name)).flatMap((m) =>
        namesOf(m).map((name) => ({ name, ...(m.path ? { path: m.path } : {}) }))
      ),
    loaded: (name) => pool.phaseOf(resolve(name)) === "loaded",
    maxBodyBytes,
  });
  const openAi = dispatchedOpenAi((fields) => {
    const { name, keepAliveMs, body } = choose(fields);
    return {
      ...(body === undefined ? {} : { body }),
      run: () => leasedOpenAi(name, () => pool.acquire(name, keepAliveMs, "")),
    };
  });
  opts.extend?.(app, { openAi, scopeOf: (req) => auth.scopeOf(req), maxBodyBytes });

  const dispatch = async (c: Context): Promise<Response> => {
    routing++;
    try {
      const req = c.req.raw;
      const asked = await askedModel(req, c.req.path, maxBodyBytes);
      const { name, keepAliveMs, body } = asked.text === undefined
        ? { ...choose(undefined), name: resolve(asked.model) }
        : choose(asked.fields);
      if (draining) {
        throw new ApiError("draining", DRAINING_MESSAGE);
      }
      const forward = rebuilt(req, body ?? asked.text);
      const tenant = auth.tenantOf(req);
      if (pool.phaseOf(name) !== "loaded") {
        const o = { pool, metrics };
        // Ollama's lines are NDJSON, which has no comment lines to report the load in.
        if (asked.fields?.stream === true && !c.req.path.startsWith("/api/")) {
          return loadingStream(o, c, { name, keepAliveMs, tenant, forward });
        }
        if (c.req.path === "/v1/stream" && isUpgrade(req)) {
          return await loadingSocket(o, c, { name, tenant, id: records.of(req)!.id });
        }
      }
      const lease = await leased(() => pool.acquire(name, keepAliveMs, tenant));
      return await passOn(c, records, lease, forward);
    } finally {
      routing--;
    }
  };
  // Every route of a model's app that the front does not answer itself is the model's: a path
  // none serves is the front's 404 (or 405), and loads, waits for or evicts no model.
  const own = new Set(app.routes.map((r) => `${r.method} ${r.path}`));
  for (const r of appRoutes()) {
    if (r.method === "ALL" || own.has(`${r.method} ${r.path}`)) continue;
    own.add(`${r.method} ${r.path}`);
    app.on(r.method, r.path, dispatch);
  }

  const hurried = new AbortController();
  return {
    app,
    fetch: (req, info) => app.fetch(req, info as never),
    metrics,
    async drain(d = {}): Promise<DrainResult> {
      draining = true;
      const timeoutMs = d.timeoutMs ?? opts.drainTimeoutMs ?? 30_000;
      // Requests still waiting for a load get it (or its error) within the deadline too.
      const deadline = Date.now() + timeoutMs;
      while (routing > 0 && Date.now() < deadline && !hurried.signal.aborted) {
        await new Promise((r) => setTimeout(r, 20));
      }
      const results = await Promise.all(
        pool.loaded().map(({ service }) =>
          service.drain({ timeoutMs: Math.max(0, deadline - Date.now()) })
        ),
      );
      await pool.close();
      return {
        completed: results.every((r) => r.completed),
        aborted: results.reduce((s, r) => s + r.aborted, 0),
      };
    },
    hurry() {
      hurried.abort();
      for (const { service } of pool.loaded()) service.hurry();
    },
    setReady() {},
    get draining() {
      return draining;
    },
    get inFlight() {
      return pool.loaded().reduce((s, m) => s + m.service.inFlight, 0);
    },
    get sockets() {
      return pool.loaded().reduce((s, m) => s + m.service.sockets, 0);
    },
    close() {
      for (const { service } of pool.loaded()) service.close();
    },
  };
}

/** A WebSocket upgrade the front may take itself (else the model's app says what is wrong). */
function isUpgrade(req: Request): boolean {
  const h = req.headers;
  return h.get("upgrade")?.toLowerCase() === "websocket" &&
    (h.get("connection") ?? "").split(",").some((t) => t.trim().toLowerCase() === "upgrade") &&
    /^[A-Za-z0-9+/]{22}==$/.test(h.get("sec-websocket-key") ?? "") &&
    h.get("sec-websocket-version") === "13";
}
