import type { Hono } from "hono";
import { IDLE_STATS } from "./app_routes.ts";
import { type ApiKeyVerifier } from "./auth.ts";
import { verifiedKey } from "./auth_middleware.ts";
import { PROMETHEUS_CONTENT_TYPE } from "./metrics.ts";
import type { ModelDirectory, ModelStatus } from "./model_directory.ts";
import { mergeModelMetrics, poolMetrics } from "./model_metrics.ts";
import type { ServiceMetrics } from "./service_metrics.ts";
import { formatKeepAlive } from "../util/duration.ts";

/** /health's last_error for a caller without an API key, where the server has keys. */
export const HIDDEN_LOAD_ERROR =
  "the last load failed (its error is shown with an API key, and in the server log)";

export interface ModelsHealthOptions {
  readonly pool: ModelDirectory;
  /** The front's own registry (connection counters, its refusals). */
  readonly metrics: ServiceMetrics;
  /** Each model's registry, kept across its loads (its counters never go back). */
  readonly modelMetrics: ReadonlyMap<string, ServiceMetrics>;
  readonly keys: ApiKeyVerifier;
  readonly isDraining: () => boolean;
}

/**
 * /health, /ready and /metrics of a front of several models, about all of them: /health each
 * model's phase, /metrics each model's registry labelled by model, then the pool's families.
 */
export function registerModelsHealthRoutes(app: Hono, o: ModelsHealthOptions): void {
  app.get("/health", async (c) => {
    // A load error names files and settings: with keys, only a caller holding one sees it
    // (as a request to the model would); without keys every caller may make that request.
    const detailed = !o.keys.enabled ||
      await verifiedKey(o.keys, c.req.raw, c.req.path).then(() => true, () => false);
    const models: Record<string, unknown> = {};
    for (const s of o.pool.status()) models[s.name] = healthOf(s, detailed);
    return c.json({ status: "ok", phase: "ready", models });
  });
  app.get(
    "/ready",
    (c) =>
      o.isDraining()
        ? c.json({ status: "unavailable", reasons: ["draining"] }, 503)
        : c.json({ status: "ready" }),
  );
  app.get("/metrics", async (c) => {
    const perModel: { model: string; text: string }[] = [];
    const loaded = new Map(o.pool.loaded().map((m) => [m.name, m.service]));
    for (const [name, registry] of o.modelMetrics) {
      const service = loaded.get(name);
      // A loaded model's app refreshes its gauges from its core as it renders them.
      const res = service === undefined ? undefined : await service.fetch(
        new Request(new URL("/metrics", c.req.url), { headers: internalHeaders(c.req.raw) }),
      );
      if (res?.ok) perModel.push({ model: name, text: await res.text() });
      else {
        await res?.body?.cancel();
        registry.setStats(IDLE_STATS, 0);
        perModel.push({ model: name, text: registry.render() });
      }
    }
    return new Response(
      mergeModelMetrics(o.metrics.render(), perModel) +
        (o.pool.countsLoads === false ? "" : poolMetrics(o.pool.status())),
      { headers: { "content-type": PROMETHEUS_CONTENT_TYPE } },
    );
  });
}

function healthOf(s: ModelStatus, detailed: boolean): Record<string, unknown> {
  return {
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

/** Headers for a request the front makes of a model's app on a client's behalf. */
function internalHeaders(req: Request): Headers {
  const h = new Headers();
  for (const name of ["host", "authorization"]) {
    const v = req.headers.get(name);
    if (v !== null) h.set(name, v);
  }
  return h;
}
