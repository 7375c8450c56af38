import type { CoreStats } from "../core/generation.ts";
import { type Counter, type Gauge, type Histogram, Registry } from "./metrics.ts";

/** What the executor reports after each step (see ServiceMetrics.observeStep). */
export interface StepObservation {
  /** Wall time of the step, from submission to results available. */
  readonly durationMs: number;
  /** Sequences in the step. */
  readonly batchSize: number;
  /** Tokens processed in the step (prefill chunk tokens + decode tokens). */
  readonly tokens?: number;
}

const LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5];
const TTFT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
const E2E_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];
const BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256];

export interface ServiceMetricsOptions {
  readonly now?: () => number;
  readonly busyWindowMs?: number;
  /**
   * Whose core these metrics describe, so that what is not measured here is absent, not 0:
   * - "own" (default): a server's, every family;
   * - "replicas": a router's, whose requests and scheduler gauges (summed over its replicas)
   *   are real but whose replicas run the steps: no step families (steps, step duration,
   *   batch size, busy time and fraction, pipeline depth, executor restarts);
   * - "none": the front of several models, each of which exports its own families under its
   *   model label: the front keeps only what it records itself (HTTP requests, errors,
   *   generations, connections).
   */
  readonly core?: "own" | "replicas" | "none";
}

/**
 * The service's metrics. The HTTP layer records request-side numbers itself; the core must
 * call observeStep() once per executor step and observeExecutorRestart() after a device
 * loss. Scheduler gauges (running, waiting, KV blocks, prefix-cache hit rate) are read from
 * backend.stats() at scrape time.
 */
export class ServiceMetrics {
  readonly registry = new Registry();
  readonly httpRequests: Counter;
  readonly generations: Counter;
  readonly errors: Counter;
  readonly promptTokens: Counter;
  readonly generatedTokens: Counter;
  readonly timeToFirstToken: Histogram;
  readonly interTokenLatency: Histogram;
  readonly endToEnd: Histogram;
  readonly queueTime: Histogram;
  readonly stepDuration: Histogram;
  readonly batchSize: Histogram;
  readonly steps: Counter;
  readonly executorBusySeconds: Counter;
  readonly executorRestarts: Counter;
  readonly grammarRestarts: Counter;
  readonly executorBusyFraction: Gauge;
  readonly pipelineDepth: Gauge;
  readonly executorHealthy: Gauge;
  readonly running: Gauge;
  readonly waiting: Gauge;
  readonly kvBlocksUsed: Gauge;
  readonly kvBlocksTotal: Gauge;
  readonly prefixCacheHitRate: Gauge;
  readonly inFlight: Gauge;
  readonly kvCacheUsage: Gauge;
  readonly resultCacheHits: Counter;
  readonly resultCacheMisses: Counter;
  readonly resultCacheBytes: Gauge;
  readonly resultCacheCapacity: Gauge;
  readonly resultCacheEntries: Gauge;
  readonly resultCacheSaved: Counter;
  readonly similarCacheLookups: Counter;
  readonly similarCacheNearMisses: Counter;
  readonly similarCacheEntries: Gauge;
  readonly similarCacheBytes: Gauge;
  readonly sharedCacheEvents: Counter;
  readonly connections: Gauge;
  readonly connectionsRefused: Counter;
  readonly connectionsTimedOut: Counter;
  /** The cache's counters at the last scrape: the counters grow by the difference. */
  #cacheSeen = { hits: 0, misses: 0, savedMs: 0 };
  #similarSeen = { hits: 0, misses: 0, near: {} as Readonly<Record<string, number>> };
  #sharedSeen: Readonly<Record<string, number>> = {};

  readonly #now: () => number;
  readonly #busyWindowMs: number;
  readonly #createdAt: number;
  /** Recent steps as [end time, duration] in ms, for the busy fraction. */
  #recentSteps: Array<[number, number]> = [];

  constructor(opts: ServiceMetricsOptions = {}) {
    this.#now = opts.now ?? (() => performance.now());
    this.#busyWindowMs = opts.busyWindowMs ?? 10_000;
    this.#createdAt = this.#now();
    const r = this.registry;
    // What is not measured here goes to a registry /metrics never renders: rendered, it would
    // read as 0 (an idle executor, an empty queue) beside the real values.
    const core = opts.core ?? "own";
    const unrendered = new Registry();
    const e = core === "own" ? r : unrendered;
    const g = core === "none" ? unrendered : r;
    this.httpRequests = r.counter(
      "llm_http_requests_total",
      "HTTP requests answered, by method, route and status (WebSocket upgrades count once).",
      ["method", "route", "status"],
    );
    this.generations = r.counter(
      "llm_generations_total",
      "Generations ended, by API and finish reason (stop, length, cancelled, error).",
      ["api", "finish_reason"],
    );
    this.errors = r.counter(
      "llm_errors_total",
      "Errors returned to clients (HTTP responses, SSE and WebSocket error frames), by code.",
      ["code"],
    );
    this.promptTokens = g.counter("llm_prompt_tokens_total", "Prompt tokens of started requests.");
    this.generatedTokens = g.counter("llm_generation_tokens_total", "Tokens generated.");
    this.timeToFirstToken = g.histogram(
      "llm_time_to_first_token_seconds",
      "From request accepted to first token sent.",
      TTFT_BUCKETS,
    );
    this.interTokenLatency = g.histogram(
      "llm_inter_token_latency_seconds",
      "Between consecutive token events of one generation.",
      LATENCY_BUCKETS,
    );
    this.endToEnd = g.histogram(
      "llm_e2e_request_latency_seconds",
      "From request accepted to its last event.",
      E2E_BUCKETS,
    );
    this.queueTime = g.histogram(
      "llm_queue_time_seconds",
      "Time a request waited before the scheduler admitted it (core timings).",
      TTFT_BUCKETS,
    );
    this.stepDuration = e.histogram(
      "llm_step_duration_seconds",
      "Executor step wall time.",
      LATENCY_BUCKETS,
    );
    this.batchSize = e.histogram(
      "llm_batch_size",
      "Sequences per executor step.",
      BATCH_BUCKETS,
    );
    this.steps = e.counter("llm_steps_total", "Executor steps run.");
    this.executorBusySeconds = e.counter(
      "llm_executor_busy_seconds_total",
      "Time spent inside executor steps; rate() of it is the busy fraction.",
    );
    this.executorRestarts = e.counter(
      "llm_executor_restarts_total",
      "Executor restarts after a device loss.",
    );
    this.grammarRestarts = r.counter(
      "llm_grammar_worker_restarts_total",
      "Grammar workers ended and started afresh, by reason (trap, budget, cancelled, crash).",
      ["reason"],
    );
    this.executorBusyFraction = e.gauge(
      "llm_executor_busy_fraction",
      "Share of wall time spent inside executor steps over the last window (GPU utilisation proxy).",
    );
    this.executorHealthy = g.gauge("llm_executor_healthy", "1 when the executor is healthy.");
    this.pipelineDepth = e.gauge(
      "llm_pipeline_depth",
      "Steps the scheduler keeps in flight now (adapted to the step's cost on webgpu).",
    );
    this.connections = r.gauge(
      "llm_http_connections",
      "Client connections open (HTTP and WebSocket).",
    );
    this.connectionsRefused = r.counter(
      "llm_http_connections_refused_total",
      "Connections closed at once because --max-connections were open.",
    );
    this.connectionsTimedOut = r.counter(
      "llm_http_connections_timed_out_total",
      "Connections closed for sending no request within --header-timeout.",
    );
    this.running = g.gauge("llm_requests_running", "Sequences in the running batch.");
    this.waiting = g.gauge("llm_requests_waiting", "Sequences waiting to be scheduled.");
    this.kvBlocksUsed = g.gauge("llm_kv_blocks_used", "KV cache blocks in use.");
    this.kvBlocksTotal = g.gauge("llm_kv_blocks_capacity", "KV cache blocks in the pool.");
    this.prefixCacheHitRate = g.gauge(
      "llm_prefix_cache_hit_rate",
      "Share of prompt tokens served from the prefix cache.",
    );
    this.inFlight = g.gauge(
      "llm_inflight_generations",
      "Generations the HTTP layer has open (HTTP and WebSocket).",
    );
    this.kvCacheUsage = g.gauge(
      "llm_kv_cache_usage_ratio",
      "KV cache blocks in use over the pool, 0 to 1.",
    );
    this.resultCacheHits = g.counter(
      "llm_result_cache_hits_total",
      "Deterministic requests answered from the result cache.",
    );
    this.resultCacheMisses = g.counter(
      "llm_result_cache_misses_total",
      "Deterministic requests the result cache did not hold (generated, then stored).",
    );
    this.resultCacheBytes = g.gauge("llm_result_cache_bytes", "Bytes held by the result cache.");
    this.resultCacheCapacity = g.gauge(
      "llm_result_cache_capacity_bytes",
      "The result cache's bound (--result-cache).",
    );
    this.resultCacheEntries = g.gauge("llm_result_cache_entries", "Answers held.");
    this.resultCacheSaved = g.counter(
      "llm_result_cache_saved_seconds_total",
      "Generation time the result cache's hits saved (the original generations' wall time).",
    );
    this.similarCacheLookups = g.counter(
      "llm_similar_cache_lookups_total",
      "Chat questions looked up in the cache for similar questions, by outcome (hit, miss).",
      ["outcome"],
    );
    this.similarCacheNearMisses = g.counter(
      "llm_similar_cache_near_misses_total",
      "Misses whose closest question scored within 0.1 below the threshold, by 0.05-wide band.",
      ["band"],
    );
    this.similarCacheEntries = g.gauge("llm_similar_cache_entries", "Questions held.");
    this.similarCacheBytes = g.gauge(
      "llm_similar_cache_bytes",
      "Bytes held by the cache for similar questions.",
    );
    this.sharedCacheEvents = r.counter(
      "llm_shared_result_cache_events_total",
      "The replicas' shared result cache, by event: hit, miss, unavailable (the store could not be reached: computed as a miss), too_large (not stored), stored.",
      ["event"],
    );
  }

  /** The core calls this once per executor step. */
  observeStep(s: StepObservation): void {
    const seconds = s.durationMs / 1000;
    this.stepDuration.observe(seconds);
    this.batchSize.observe(s.batchSize);
    this.steps.inc();
    this.executorBusySeconds.inc(undefined, Math.max(0, seconds));
    this.#recentSteps.push([this.#now(), Math.max(0, s.durationMs)]);
    this.#trim(this.#now());
  }

  /** The core calls this when it rebuilds the executor after a device loss. */
  observeExecutorRestart(): void {
    this.executorRestarts.inc();
  }

  /** A grammar worker was ended (a trap, a compile over budget or cancelled, a crash). */
  observeGrammarRestart(reason: string): void {
    this.grammarRestarts.inc({ reason });
  }

  /** Busy share of the last window (or of the time since start, if shorter), in [0, 1]. */
  busyFraction(): number {
    const now = this.#now();
    this.#trim(now);
    const windowStart = now - this.#busyWindowMs;
    let busy = 0;
    for (const [end, dur] of this.#recentSteps) busy += Math.min(dur, end - windowStart);
    const span = Math.min(this.#busyWindowMs, now - this.#createdAt);
    if (span <= 0) return 0;
    return Math.min(1, Math.max(0, busy / span));
  }

  #trim(now: number): void {
    const windowStart = now - this.#busyWindowMs;
    let drop = 0;
    while (drop < this.#recentSteps.length && (this.#recentSteps[drop]?.[0] ?? 0) <= windowStart) {
      drop++;
    }
    if (drop > 0) this.#recentSteps.splice(0, drop);
  }

  /** Copies a core snapshot into the scheduler gauges. */
  setStats(stats: CoreStats, inFlight: number): void {
    this.running.set(stats.running);
    this.waiting.set(stats.waiting);
    this.kvBlocksUsed.set(stats.kvBlocksUsed);
    this.kvBlocksTotal.set(stats.kvBlocksTotal);
    this.prefixCacheHitRate.set(stats.prefixCacheHitRate);
    this.executorHealthy.set(stats.executorHealthy ? 1 : 0);
    if (stats.pipelineDepth !== undefined) this.pipelineDepth.set(stats.pipelineDepth);
    this.inFlight.set(inFlight);
    this.executorBusyFraction.set(this.busyFraction());
    const usage = stats.kvBlocksTotal > 0 ? stats.kvBlocksUsed / stats.kvBlocksTotal : 0;
    this.kvCacheUsage.set(usage);
    const rc = stats.resultCache;
    if (rc !== undefined) {
      const seen = this.#cacheSeen;
      this.resultCacheHits.inc(undefined, Math.max(0, rc.hits - seen.hits));
      this.resultCacheMisses.inc(undefined, Math.max(0, rc.misses - seen.misses));
      this.resultCacheSaved.inc(undefined, Math.max(0, rc.savedMs - seen.savedMs) / 1000);
      this.#cacheSeen = { hits: rc.hits, misses: rc.misses, savedMs: rc.savedMs };
    }
    const sc = rc?.similar;
    if (sc !== undefined) {
      const seen = this.#similarSeen;
      this.similarCacheLookups.inc({ outcome: "hit" }, Math.max(0, sc.hits - seen.hits));
      this.similarCacheLookups.inc({ outcome: "miss" }, Math.max(0, sc.misses - seen.misses));
      for (const [band, n] of Object.entries(sc.nearMisses)) {
        this.similarCacheNearMisses.inc({ band }, Math.max(0, n - (seen.near[band] ?? 0)));
      }
      this.#similarSeen = { hits: sc.hits, misses: sc.misses, near: sc.nearMisses };
    }
    if (rc?.shared !== undefined) {
      const sh = rc.shared;
      const now: Record<string, number> = {
        hit: sh.hits,
        miss: sh.misses,
        unavailable: sh.unavailable,
        too_large: sh.tooLarge,
        stored: sh.stored,
      };
      for (const [event, n] of Object.entries(now)) {
        this.sharedCacheEvents.inc({ event }, Math.max(0, n - (this.#sharedSeen[event] ?? 0)));
      }
      this.#sharedSeen = now;
    }
    this.similarCacheEntries.set(sc?.entries ?? 0);
    this.similarCacheBytes.set(sc?.bytes ?? 0);
    this.resultCacheBytes.set(rc?.bytes ?? 0);
    this.resultCacheCapacity.set(rc?.capacityBytes ?? 0);
    this.resultCacheEntries.set(rc?.entries ?? 0);
  }

  render(): string {
    return this.registry.render();
  }
}
