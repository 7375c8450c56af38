/**
 * The service of a server with several models: each loaded model has a whole app of its own
 * (lib/http's, over its own engine, KV pool and scheduler), and this front sends each request
 * to the one its `model` field names, loading it first through the pool. What is about all
 * models (/v1/models, /health, /ready, /metrics) it answers itself.
 */
import { IDLE_STATS } from "../http/app_routes.ts";
import { decodeBody } from "../http/body.ts";
import { HTTP_DEFAULTS } from "../http/defaults.ts";
import { Hono } from "hono";
import { upgradeWebSocket } from "@hono/node-server";
import type { WSContext } from "hono/ws";
import type { ErrorFrame, LoadingFrame } from "../http/protocol.ts";
import type { AppContext, DrainResult, ServiceApp } from "../http/app.ts";
import { ApiKeyVerifier, keyScope } from "../http/auth.ts";
import { verifiedKey } from "../http/auth_middleware.ts";
import { ApiError, preview, toApiError } from "../http/errors.ts";
import { ChatRequestError } from "../chat/chat_error.ts";
import { appRoutes } from "../http/app_routes.ts";
import { unroutedError } from "../http/error_mapping.ts";
import { RouteTable } from "../http/route_table.ts";
import type { OpenAiHandler } from "../http/openai_routes.ts";
import { PROMETHEUS_CONTENT_TYPE } from "../http/metrics.ts";
import { OriginPolicy } from "../http/origin.ts";
import { isValidRequestId, newRequestId, RequestLog } from "../http/request_log.ts";
import type { ServiceMetrics } from "../http/service_metrics.ts";
import { formatKeepAlive, parseKeepAlive } from "../util/duration.ts";
import { type Lease, ModelLoadError, type ModelPhase, type ModelStatus } from "./model_pool.ts";
import { mergeModelMetrics, poolMetrics } from "./model_metrics.ts";
import { DRAINING_MESSAGE } from "../core/draining.ts";

/** What /v1/models says of a model, loaded or not. */
export interface CatalogModel {
  readonly name: string;
  /** Further names a request may give for it (`--served-model-name alias=model`). */
  readonly aliases?: readonly string[];
  readonly path?: string;
  readonly bytes?: number;
  readonly format?: string;
  readonly architecture?: string;
  readonly quantization?: string;
  /** The context the file declares (or --context-length). */
  readonly contextLength?: number;
}

/**
 * The models behind the front and how to get one's app: the pool of a server (which loads
 * them), or a router's models as replicas advertise them (lib/cluster/model_router.ts).
 */
export interface ModelDirectory {
  readonly names: readonly string[];
  has(name: string): boolean;
  phaseOf(name: string): ModelPhase | undefined;
  /**
   * The model's app, held until release(); rejects with ModelLoadError. `tenant` (the API key's
   * scope, "" without keys) is whose keep-alive `keepAliveMs` sets.
   */
  acquire(name: string, keepAliveMs?: number, tenant?: string): Promise<Lease<ServiceApp>>;
  status(): ModelStatus[];
  loaded(): { name: string; service: ServiceApp }[];
  close(): Promise<void>;
  /**
   * False for a directory that loads nothing itself (a router by model): its status has no
   * loads, evictions or resident bytes to export, and zeros would read as measurements.
   */
  readonly countsLoads?: boolean;
}

export interface ModelsServiceOptions {
  readonly pool: ModelDirectory;
  /** What /v1/models lists, first the default model (a function where it changes). */
  readonly catalog: readonly CatalogModel[] | (() => readonly CatalogModel[]);
  /** Serves /metrics' connection counters (serveService writes them). */
  readonly metrics: ServiceMetrics;
  /**
   * Each model's registry, kept across its loads (so its counters never go back when it is
   * unloaded and loaded again); each load's app writes to it.
   */
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
  /**
   * Mounts routes served by the front for every model (the batch queue, lib/batch/): their
   * `openAi` handler runs each request on the app of the model its body names.
   */
  readonly extend?: (app: Hono, ctx: AppContext) => void;
}

/** POST routes whose JSON body names the model. */
export const BODY_ROUTES: ReadonlySet<string> = new Set([
  "/v1/completions",
  "/v1/chat/completions",
  "/tokenize",
  "/detokenize",
]);

export function createModelsService(opts: ModelsServiceOptions): ServiceApp {
  const { pool, metrics } = opts;
  const keys = new ApiKeyVerifier(opts.apiKeys ?? []);
  const origins = new OriginPolicy(opts.corsOrigins ?? [], opts.allowedHosts ?? []);
  const requestLog = opts.requestLog ?? new RequestLog();
  const maxBodyBytes = opts.maxBodyBytes ?? HTTP_DEFAULTS.maxBodyBytes;
  const catalog = () => typeof opts.catalog === "function" ? opts.catalog() : opts.catalog;
  const defaultModel = () => catalog()[0]?.name ?? "";
  const createdAt = Math.floor(Date.now() / 1000);
  let draining = false;
  /** What a model's app serves: any other path is answered here, with no model loaded. */
  const modelRoutes = new RouteTable(appRoutes);
  /** Whether a model's app has a route for the request (a CORS preflight: any method of it). */
  const routed = (method: string, path: string) =>
    modelRoutes.patternFor(method, path) !== undefined ||
    (method === "OPTIONS" && modelRoutes.allowed(path) !== undefined);
  /** Requests between arriving and their model's answer being passed on (loads included). */
  let routing = 0;

  /** A name a request gave: the model's own, or an alias of it (undefined: none). */
  const resolve = (asked: string): string | undefined => {
    if (pool.has(asked)) return asked;
    const m = catalog().find((c) => c.aliases?.includes(asked));
    return m !== undefined && pool.has(m.name) ? m.name : undefined;
  };
  const aliasesOf = (name: string) => catalog().find((c) => c.name === name)?.aliases ?? [];
  const served = () =>
    pool.names.flatMap((n) => [n, ...aliasesOf(n)]).map((n) => `"${n}"`).join(", ");
  const unknownModel = (asked: unknown) =>
    new ApiError(
      "model_not_found",
      `The model ${preview(asked)} does not exist; this server serves ${served()}`,
      "model",
    );

  /** A model's /v1/models entry, under `id` (its name or an alias; `root` is its name). */
  const describe = (m: CatalogModel, id = m.name) => {
    const s = pool.status().find((x) => x.name === m.name);
    return {
      id,
      object: "model",
      created: createdAt,
      owned_by: "llmserve",
      root: m.name,
      ...(m.contextLength === undefined ? {} : { max_model_len: m.contextLength }),
      // Ollama's /api/ps and /api/tags say as much; OpenAI clients ignore what they do not know.
      loaded: s?.phase === "loaded",
      phase: s?.phase ?? "unloaded",
      ...(m.bytes === undefined ? {} : { size_bytes: m.bytes }),
      ...(m.format === undefined ? {} : { format: m.format }),
      ...(m.architecture === undefined ? {} : { architecture: m.architecture }),
      ...(m.quantization === undefined ? {} : { quantization: m.quantization }),
    };
  };

  /** The cache scope of a request whose key the gate verified (with --cache-scope key). */
  const scopes = new WeakMap<Request, string>();
  /** Whose keep-alive a request sets: its key's scope whatever --cache-scope says. */
  const tenants = new WeakMap<Request, string>();
  const tenantOf = (req: Request) => tenants.get(req) ?? "";
  const scopeByKey = opts.cacheScope !== "global";

  /** Host/Origin and API key checks for what this front answers itself. */
  const gate = async (req: Request, path: string): Promise<void> => {
    const refusal = origins.check(
      req.headers.get("host") ?? undefined,
      req.headers.get("origin") ?? undefined,
    );
    if (refusal !== null) {
      throw new ApiError(
        origins.hostAllowed(req.headers.get("host") ?? "") ? "forbidden_origin" : "forbidden_host",
        refusal,
      );
    }
    const open = path === "/health" || path === "/ready" ||
      (path === "/metrics" && opts.metricsPublic === true);
    if (!keys.enabled || open) return;
    const token = await verifiedKey(keys, req, path);
    if (token === null) return;
    const scope = await keyScope(token);
    tenants.set(req, scope);
    if (scopeByKey) scopes.set(req, scope);
  };

  const own = async (req: Request, path: string): Promise<Response | undefined> => {
    if (req.method !== "GET" && req.method !== "HEAD") return undefined;
    if (path === "/health") {
      // A load error names files and settings: with keys, only a caller holding one sees it
      // (as a request to the model would); without keys every caller may make that request.
      const detailed = !keys.enabled ||
        await verifiedKey(keys, req, path).then(() => true, () => false);
      const models: Record<string, unknown> = {};
      for (const s of pool.status()) {
        models[s.name] = {
          phase: s.phase,
          ...(s.phase === "unloaded" ? {} : { bytes: s.bytes, in_flight: s.inFlight }),
          ...(s.phase === "loaded" ? { keep_alive: formatKeepAlive(s.keepAliveMs) } : {}),
          ...(s.expiresInMs === undefined ? {} : {
            expires_at: s.expiresInMs === Infinity
              ? "never"
              : new Date(Date.now() + s.expiresInMs).toISOString(),
          }),
          ...(s.progress ? { progress: s.progress } : {}),
          ...(s.lastError === undefined
            ? {}
            : { last_error: detailed ? s.lastError : HIDDEN_LOAD_ERROR }),
        };
      }
      return Response.json({ status: "ok", phase: "ready", models });
    }
    if (path === "/ready") {
      return draining
        ? Response.json({ status: "unavailable", reasons: ["draining"] }, { status: 503 })
        : Response.json({ status: "ready" });
    }
    if (path === "/metrics") {
      await gate(req, path);
      const perModel: { model: string; text: string }[] = [];
      const loaded = new Map(pool.loaded().map((m) => [m.name, m.service]));
      for (const [name, registry] of opts.modelMetrics) {
        const service = loaded.get(name);
        // A loaded model's app refreshes its gauges from its core as it renders them.
        const res = service === undefined ? undefined : await service.fetch(
          new Request(new URL("/metrics", req.url), { headers: internalHeaders(req) }),
        );
        if (res?.ok) perModel.push({ model: name, text: await res.text() });
        else {
          await res?.body?.cancel();
          registry.setStats(IDLE_STATS, 0);
          perModel.push({ model: name, text: registry.render() });
        }
      }
      return new Response(
        mergeModelMetrics(metrics.render(), perModel) +
          (pool.countsLoads === false ? "" : poolMetrics(pool.status())),
        { headers: { "content-type": PROMETHEUS_CONTENT_TYPE } },
      );
    }
    if (path === "/v1/models") {
      await gate(req, path);
      return Response.json({
        object: "list",
        data: catalog().flatMap((m) => [m.name, ...(m.aliases ?? [])].map((id) => describe(m, id))),
      });
    }
    if (path.startsWith("/v1/models/")) {
      await gate(req, path);
      const id = decodeURIComponent(path.slice("/v1/models/".length));
      const name = resolve(id);
      const m = catalog().find((c) => c.name === name);
      if (m === undefined) throw unknownModel(id);
      return Response.json(describe(m, id));
    }
    return undefined;
  };

  /** The model a request is for, and the request to pass on (its body without keep_alive). */
  const pick = async (
    req: Request,
    path: string,
  ): Promise<{ name: string; keepAliveMs?: number; stream?: boolean; forward: Request }> => {
    if (req.method === "POST" && BODY_ROUTES.has(path)) {
      const length = Number(req.headers.get("content-length") ?? "0");
      if (length > maxBodyBytes) throw tooLarge(length);
      const text = await readCapped(req, maxBodyBytes, tooLarge);
      const fields = objectBody(text);
      // Not a JSON object: the default model's app says what is wrong with it.
      if (fields === undefined) return { name: defaultModel(), forward: rebuilt(req, text) };
      const asked = fields.model;
      let name = defaultModel();
      if (asked !== undefined && asked !== null) {
        const resolved = typeof asked === "string" ? resolve(asked) : undefined;
        if (resolved === undefined) throw unknownModel(asked);
        name = resolved;
      }
      const stream = fields.stream === true;
      let keepAliveMs: number | undefined;
      if ("keep_alive" in fields) {
        const k = parseKeepAlive(fields.keep_alive);
        if (typeof k === "string") {
          throw new ApiError("invalid_request", `Invalid 'keep_alive': ${k}`, "keep_alive");
        }
        keepAliveMs = k;
        delete fields.keep_alive;
        return { name, keepAliveMs, stream, forward: rebuilt(req, JSON.stringify(fields)) };
      }
      return { name, stream, forward: rebuilt(req, text) };
    }
    // A WebSocket, the playground, /props and the rest: ?model= picks, else the default model.
    const asked = new URL(req.url).searchParams.get("model");
    const resolved = asked === null ? defaultModel() : resolve(asked);
    if (resolved === undefined) throw unknownModel(asked);
    return { name: resolved, forward: req };
  };

  /**
   * A completion request of the front's own routes (a batch line): run on the app of the
   * model its body names, loaded first if need be, and held until its answer is read.
   */
  const openAi: OpenAiHandler = async (req, kind, scope) => {
    const text = await req.text();
    // Not a JSON object: the default model's app says what is wrong with it.
    const fields = objectBody(text);
    let name = defaultModel();
    let keepAliveMs: number | undefined;
    if (fields !== undefined) {
      const asked = fields.model;
      if (asked !== undefined && asked !== null) {
        const resolved = typeof asked === "string" ? resolve(asked) : undefined;
        if (resolved === undefined) throw unknownModel(asked);
        name = resolved;
      }
      if ("keep_alive" in fields) {
        const k = parseKeepAlive(fields.keep_alive);
        if (typeof k === "string") {
          throw new ApiError("invalid_request", `Invalid 'keep_alive': ${k}`, "keep_alive");
        }
        keepAliveMs = k;
        delete fields.keep_alive;
      }
    }
    let lease: Lease<ServiceApp>;
    try {
      lease = await pool.acquire(name, keepAliveMs, scope ?? "");
    } catch (err) {
      throw err instanceof ModelLoadError ? loadError(err) : err;
    }
    try {
      const run = lease.model.service.openAi;
      if (run === undefined) throw new Error(`the app of model "${name}" runs no completions`);
      const res = await run(
        rebuilt(req, fields === undefined ? text : JSON.stringify(fields)),
        kind,
        scope,
      );
      // Read whole while the model is held (a batch line never streams).
      return new Response(await res.arrayBuffer(), { status: res.status, headers: res.headers });
    } finally {
      lease.release();
    }
  };
  /** The routes `extend` mounts, behind the front's own checks (gate). */
  const extraApp = opts.extend === undefined ? undefined : (() => {
    const app = new Hono();
    app.onError((err, c) =>
      errorResponse(toApiError(err), c.req.header("x-request-id") ?? newRequestId())
    );
    opts.extend!(app, { openAi, scopeOf: (req) => scopes.get(req), maxBodyBytes });
    return app;
  })();
  const isExtraPath = (path: string) =>
    extraApp !== undefined && /^\/v1\/(files|batches)(\/|$)/.test(path);

  const errorResponse = (e: ApiError, id: string, path?: string): Response => {
    metrics.errors.inc({ code: e.code });
    const headers: Record<string, string> = { "x-request-id": id };
    const retryAfter = retryAfterOf.has(e) ? retryAfterOf.get(e) : 1;
    if ((e.status === 503 || e.status === 429) && retryAfter != null) {
      headers["retry-after"] = String(retryAfter);
    }
    const allow = path === undefined ? undefined : modelRoutes.allowed(path);
    if (e.code === "method_not_allowed" && allow !== undefined) headers["allow"] = allow;
    if (e.status === 401) headers["www-authenticate"] = 'Bearer realm="llmserve"';
    return Response.json(e.toJSON(), { status: e.status, headers });
  };

  const fetch = async (req: Request, info?: unknown): Promise<Response> => {
    const path = new URL(req.url).pathname;
    const asked = req.headers.get("x-request-id");
    const id = asked !== null && isValidRequestId(asked) ? asked : newRequestId();
    let lease: Lease<ServiceApp> | undefined;
    routing++;
    try {
      const answered = await own(req, path);
      if (answered !== undefined) {
        answered.headers.set("x-request-id", id);
        if (!(path === "/health" || path === "/ready" || path === "/metrics")) {
          requestLog.record(id, req.method, path).responded(answered.status);
        }
        return answered;
      }
      // The key first: an unknown model's answer names the served ones.
      await gate(req, path);
      if (isExtraPath(path)) {
        const res = await extraApp!.fetch(req);
        res.headers.set("x-request-id", id);
        requestLog.record(id, req.method, path).responded(res.status);
        return res;
      }
      // Before pick(): a 404 or 405 must not load, wait for or evict a model.
      if (!routed(req.method, path)) throw unroutedError(req.method, path, modelRoutes);
      const picked = await pick(req, path);
      if (draining) {
        throw new ApiError("draining", DRAINING_MESSAGE);
      }
      if (picked.stream && pool.phaseOf(picked.name) !== "loaded") {
        return loadingStream(
          picked.name,
          picked.keepAliveMs,
          tenantOf(req),
          picked.forward,
          info,
          id,
        );
      }
      if (path === "/v1/stream" && isUpgrade(req) && pool.phaseOf(picked.name) !== "loaded") {
        requestLog.record(id, req.method, path).responded(101);
        return await loadingSocket(picked.name, req, info, id);
      }
      lease = await pool.acquire(picked.name, picked.keepAliveMs, tenantOf(req));
      const res = await lease.model.service.fetch(picked.forward, info);
      const held = lease;
      lease = undefined;
      return releasedWhenDone(res, () => held.release());
    } catch (err) {
      lease?.release();
      const e = err instanceof ApiError || err instanceof ChatRequestError
        ? toApiError(err)
        : err instanceof ModelLoadError
        ? loadError(err)
        : toInternal(err);
      const res = errorResponse(e, id, path);
      const record = requestLog.record(id, req.method, path);
      record.code = e.code;
      record.responded(res.status);
      return res;
    } finally {
      routing--;
    }
  };

  /**
   * A stream for a model that is not loaded yet: answered at once, with an SSE comment line on
   * how the load goes every half second (clients skip comments), then the model's own stream.
   * Past the 200, a failed load or a refused request is a final `data: {"error": ...}` event,
   * as any error once a stream has begun.
   */
  const loadingStream = (
    name: string,
    keepAliveMs: number | undefined,
    tenant: string,
    forward: Request,
    info: unknown,
    id: string,
  ): Response => {
    const enc = new TextEncoder();
    let timer: ReturnType<typeof setInterval> | undefined;
    let upstream: ReadableStreamDefaultReader<Uint8Array> | undefined;
    let release = () => {};
    let cancelled = false;
    const body = new ReadableStream<Uint8Array>({
      start: async (controller) => {
        const say = () => {
          const s = pool.status().find((x) => x.name === name)!;
          const p = s.progress;
          controller.enqueue(enc.encode(
            `: loading model ${JSON.stringify(name)}${
              p ? ` ${p.bytes}${p.total === undefined ? "" : `/${p.total}`} bytes` : ""
            }\n\n`,
          ));
        };
        say();
        timer = setInterval(say, 500);
        const fail = (e: ApiError) => {
          metrics.errors.inc({ code: e.code });
          controller.enqueue(enc.encode(`data: ${JSON.stringify(e.toJSON())}\n\n`));
          controller.close();
        };
        try {
          const lease = await pool.acquire(name, keepAliveMs, tenant);
          release = () => lease.release();
          clearInterval(timer);
          const res = await lease.model.service.fetch(forward, info);
          if (!res.ok || res.body === null) {
            const text = res.body === null ? "" : await res.text();
            release();
            // The model's app refused the request (a 4xx naming the problem): pass its
            // error envelope on as the stream's one event.
            let envelope: unknown;
            try {
              envelope = { error: JSON.parse(text).error };
            } catch {
              envelope = toInternal(`the model's app answered ${res.status}: ${text}`).toJSON();
            }
            controller.enqueue(enc.encode(`data: ${JSON.stringify(envelope)}\n\n`));
            controller.close();
            return;
          }
          upstream = res.body.getReader();
          for (;;) {
            const { value, done } = await upstream.read();
            if (done) break;
            controller.enqueue(value);
          }
          controller.close();
        } catch (err) {
          clearInterval(timer);
          if (cancelled) return; // the client left: nothing to tell it
          fail(err instanceof ModelLoadError ? loadError(err) : toInternal(err));
        } finally {
          release();
        }
      },
      cancel: async (reason) => {
        cancelled = true;
        clearInterval(timer);
        await upstream?.cancel(reason);
        release();
      },
    });
    requestLog.record(id, "POST", new URL(forward.url).pathname).responded(200);
    return new Response(body, {
      headers: {
        "content-type": "text/event-stream",
        "cache-control": "no-cache",
        "x-request-id": id,
      },
    });
  };

  /**
   * A WebSocket for a model that is not loaded yet: upgraded at once, told how the load goes by
   * `loading` frames (at once, then every half second), then handed to the model's app, which
   * answers the client frames held meanwhile. A failed load is an error frame and a close.
   */
  const pendingSockets = new WeakMap<Request, { name: string; id: string }>();
  const socketApp = new Hono();
  socketApp.get(
    "/v1/stream",
    upgradeWebSocket((c) => {
      const upgrade = c.req.raw;
      const { name, id } = pendingSockets.get(upgrade)!;
      const tenant = tenantOf(upgrade);
      const client = (c.env as { incoming?: { socket?: { remoteAddress?: string } } } | undefined)
        ?.incoming?.socket?.remoteAddress;
      const held: unknown[] = [];
      let session: { onMessage(data: unknown): void; onClose(): void } | undefined;
      let closed = false;
      let timer: ReturnType<typeof setInterval> | undefined;
      const t0 = performance.now();
      const send = (ws: WSContext, frame: LoadingFrame | ErrorFrame) => {
        if (ws.readyState === 1) ws.send(JSON.stringify(frame));
      };
      return {
        onOpen: (_evt, ws) => {
          const say = () => {
            const p = pool.status().find((x) => x.name === name)?.progress;
            send(ws, {
              type: "loading",
              model: name,
              bytes: p?.bytes ?? 0,
              ...(p?.total === undefined ? {} : { total_bytes: p.total }),
              elapsed_s: Math.round(performance.now() - t0) / 1000,
            });
          };
          say();
          timer = setInterval(say, 500);
          (async () => {
            const lease = await pool.acquire(name, undefined, tenant);
            try {
              clearInterval(timer);
              if (closed) return;
              const app = lease.model.service;
              if (app.adoptSocket === undefined) {
                throw new Error(`model "${name}" cannot take a socket`);
              }
              session = await app.adoptSocket(ws, upgrade, id, client);
              if (closed) return session.onClose();
              for (const data of held.splice(0)) session.onMessage(data);
            } finally {
              // As for an upgrade passed on: the socket's generations keep the model busy().
              lease.release();
            }
          })().catch((err) => {
            clearInterval(timer);
            if (closed) return;
            const e = err instanceof ModelLoadError ? loadError(err) : toInternal(err);
            metrics.errors.inc({ code: e.code });
            send(ws, { type: "error", code: e.code, message: e.message, param: "model" });
            ws.close(1011, "the model could not be loaded");
          });
        },
        onMessage: (evt, ws) => {
          if (session !== undefined) return session.onMessage(evt.data);
          if (held.length >= MAX_HELD_FRAMES) {
            return send(ws, {
              type: "error",
              code: "loading",
              message: `The model "${name}" is loading; at most ${MAX_HELD_FRAMES} frames are ` +
                "held until it is ready, this one was dropped",
            });
          }
          held.push(evt.data);
        },
        onClose: () => {
          closed = true;
          clearInterval(timer);
          session?.onClose();
        },
      };
    }),
  );
  const loadingSocket = async (name: string, req: Request, info: unknown, id: string) => {
    pendingSockets.set(req, { name, id });
    return await socketApp.fetch(req, info as never);
  };

  const hurried = new AbortController();
  return {
    get app(): never {
      throw new Error("The models service has no Hono app of its own; each model's app has one");
    },
    fetch,
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

  function tooLarge(bytes: number): ApiError {
    return new ApiError(
      "payload_too_large",
      `Request body of ${bytes} bytes is over the limit of ${maxBodyBytes} bytes`,
    );
  }
}

/** /health's last_error for a caller without an API key, where the server has keys. */
export const HIDDEN_LOAD_ERROR =
  "the last load failed (its error is shown with an API key, and in the server log)";

/** Client frames a socket may send while its model loads (answered once it is loaded). */
const MAX_HELD_FRAMES = 64;

/** A WebSocket upgrade the front may take itself (else the model's app says what is wrong). */
function isUpgrade(req: Request): boolean {
  const h = req.headers;
  return h.get("upgrade")?.toLowerCase() === "websocket" &&
    (h.get("connection") ?? "").split(",").some((t) => t.trim().toLowerCase() === "upgrade") &&
    /^[A-Za-z0-9+/]{22}==$/.test(h.get("sec-websocket-key") ?? "") &&
    h.get("sec-websocket-version") === "13";
}

/** Retry-After seconds of a 503 other than 1; null: none, as waiting will not help. */
const retryAfterOf = new WeakMap<ApiError, number | null>();

function loadError(err: ModelLoadError): ApiError {
  const e = new ApiError(
    err.insufficientMemory ? "insufficient_memory" : "model_load_failed",
    err.message,
    "model",
  );
  retryAfterOf.set(e, err.insufficientMemory ? err.retryAfterSeconds : null);
  return e;
}

function toInternal(err: unknown): ApiError {
  return new ApiError(
    "internal",
    `Internal error: ${err instanceof Error ? err.message : String(err)}`,
  );
}

/** The body as text, refused once it passes `max` bytes (a chunked body names no length). */
export async function readCapped(
  req: Request,
  max: number,
  tooLarge: (bytes: number) => ApiError,
): Promise<string> {
  if (req.body === null) return "";
  const chunks: Uint8Array[] = [];
  let bytes = 0;
  for await (const chunk of req.body) {
    bytes += chunk.byteLength;
    if (bytes > max) throw tooLarge(bytes);
    chunks.push(chunk);
  }
  const all = new Uint8Array(bytes);
  let at = 0;
  for (const c of chunks) (all.set(c, at), at += c.byteLength);
  return decodeBody(all);
}

/** A request body's fields when it is a JSON object; undefined for anything else. */
export function objectBody(text: string): Record<string, unknown> | undefined {
  try {
    const body = JSON.parse(text);
    if (body !== null && typeof body === "object" && !Array.isArray(body)) return body;
  } catch { /* not JSON */ }
  return undefined;
}

/** The same request with the body given (the original's was read to find the model). */
export function rebuilt(req: Request, body: string): Request {
  const headers = new Headers(req.headers);
  headers.delete("content-length");
  return new Request(req.url, { method: req.method, headers, body, signal: req.signal });
}

/** Headers for a request the front makes of a model's app on a client's behalf. */
function internalHeaders(req: Request): Headers {
  const h = new Headers();
  for (const name of ["host", "authorization"]) {
    const v = req.headers.get(name);
    if (v !== null) h.set(name, v);
  }
  return h;
}

/**
 * The response, with `done` called once its body has been sent or abandoned: a model stays
 * held (never unloaded) while a stream from it is being read.
 */
function releasedWhenDone(res: Response, done: () => void): Response {
  if (res.body === null || res.status === 101) {
    done();
    return res;
  }
  const reader = res.body.getReader();
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const { value, done: end } = await reader.read();
        if (end) {
          controller.close();
          done();
        } else controller.enqueue(value);
      } catch (e) {
        done();
        controller.error(e);
      }
    },
    cancel(reason) {
      done();
      return reader.cancel(reason);
    },
  });
  return new Response(body, {
    status: res.status,
    statusText: res.statusText,
    headers: res.headers,
  });
}
