import type { Hono } from "hono";
import type { GenerationBackend } from "../core/generation.ts";
import type { InFlightRegistry } from "./inflight.ts";
import { PROMETHEUS_CONTENT_TYPE } from "./metrics.ts";
import type { ServiceMetrics } from "./service_metrics.ts";

export interface HealthState {
  readonly backend: GenerationBackend;
  readonly metrics: ServiceMetrics;
  readonly inflight: InFlightRegistry;
  /** False while the model loads (set by the start-up code). */
  readonly isLoaded: () => boolean;
  readonly isDraining: () => boolean;
}

/** Why the server should not get traffic now; empty when ready. */
export function notReadyReasons(s: HealthState): string[] {
  const reasons: string[] = [];
  if (!s.isLoaded()) reasons.push("model not loaded");
  if (s.isDraining()) reasons.push("draining");
  if (s.backend.readinessProblems) {
    reasons.push(...s.backend.readinessProblems());
    return reasons;
  }
  let healthy = false;
  try {
    healthy = s.backend.stats().executorHealthy;
  } catch {
    healthy = false;
  }
  if (!healthy) reasons.push("executor unhealthy");
  return reasons;
}

/**
 * GET /health: the process answers (always 200). GET /ready: 200 only when the model is
 * loaded, the executor is healthy and the server is not draining; 503 with the reasons
 * otherwise. GET /metrics: Prometheus text.
 */
export function registerHealthRoutes(app: Hono, s: HealthState): void {
  app.get("/health", (c) => c.json({ status: "ok", phase: "ready" }));
  app.get("/ready", (c) => {
    const reasons = notReadyReasons(s);
    if (reasons.length === 0) return c.json({ status: "ready" });
    return c.json({ status: "unavailable", reasons }, 503);
  });
  app.get("/metrics", () => {
    s.metrics.setStats(s.backend.stats(), s.inflight.size);
    return new Response(s.metrics.render(), {
      headers: { "content-type": PROMETHEUS_CONTENT_TYPE },
    });
  });
}
