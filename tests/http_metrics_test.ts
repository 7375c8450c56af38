import { assert, assertAlmostEquals, assertEquals, assertMatch, assertThrows } from "@std/assert";
import { PROMETHEUS_CONTENT_TYPE, Registry } from "../lib/http/metrics.ts";
import { ServiceMetrics } from "../lib/http/service_metrics.ts";
import { metricValue, postJson, scrape, startService } from "./_http_harness.ts";

Deno.test("Registry renders counters, gauges and histograms in Prometheus text format", () => {
  const r = new Registry();
  const c = r.counter("app_requests_total", "Requests.", ["code"]);
  const g = r.gauge("app_queue", "Queue length.");
  const h = r.histogram("app_latency_seconds", "Latency.", [0.5, 0.1, 1]);
  c.inc({ code: "200" });
  c.inc({ code: "200" }, 2);
  c.inc({ code: 'a"b\\c\nd' });
  g.set(4);
  g.add(-1.5);
  for (const v of [0.05, 0.1, 0.3, 2]) h.observe(v);
  // Written by hand from the exposition format spec: cumulative buckets, le sorted, +Inf = count.
  assertEquals(
    r.render(),
    `# HELP app_requests_total Requests.
# TYPE app_requests_total counter
app_requests_total{code="200"} 3
app_requests_total{code="a\\"b\\\\c\\nd"} 1
# HELP app_queue Queue length.
# TYPE app_queue gauge
app_queue 2.5
# HELP app_latency_seconds Latency.
# TYPE app_latency_seconds histogram
app_latency_seconds_bucket{le="0.1"} 2
app_latency_seconds_bucket{le="0.5"} 3
app_latency_seconds_bucket{le="1"} 3
app_latency_seconds_bucket{le="+Inf"} 4
app_latency_seconds_sum 2.45
app_latency_seconds_count 4
`,
  );
  assertThrows(() => c.inc({ nope: "x" }), Error, "has no label 'nope'");
  assertThrows(() => c.inc(undefined, -1), Error, "cannot decrease");
  assertThrows(() => r.gauge("app_queue", "again"), Error, "already registered");
});

Deno.test("ServiceMetrics busy fraction is time inside steps over the recent window", () => {
  let now = 0;
  const m = new ServiceMetrics({ now: () => now, busyWindowMs: 10_000 });
  now = 1000;
  m.observeStep({ durationMs: 250, batchSize: 3 });
  assertAlmostEquals(m.busyFraction(), 0.25, 1e-12); // 250 ms busy out of 1 s alive
  now = 4000;
  m.observeStep({ durationMs: 750, batchSize: 5 });
  assertAlmostEquals(m.busyFraction(), 1000 / 4000, 1e-12);
  now = 30_000; // both steps left the 10 s window
  assertEquals(m.busyFraction(), 0);
  m.observeStep({ durationMs: 2000, batchSize: 1 });
  assertAlmostEquals(m.busyFraction(), 0.2, 1e-12);
  assertEquals(m.batchSize.count(), 3);
  assertAlmostEquals(m.executorBusySeconds.get(), 3, 1e-12);
  const text = m.render();
  assertEquals(metricValue(text, 'llm_batch_size_bucket{le="4"}'), 2);
  assertEquals(metricValue(text, 'llm_batch_size_bucket{le="2"}'), 1);
  assertEquals(metricValue(text, "llm_steps_total"), 3);
});

Deno.test("GET /metrics exposes every service metric with the right type and values", async () => {
  await using svc = await startService({ tokenDelayMs: 3 });
  const res = await postJson(svc.base + "/v1/completions", { prompt: "count me", max_tokens: 6 });
  assertEquals(res.status, 200);
  await res.json();
  svc.service.metrics.observeStep({ durationMs: 12, batchSize: 7, tokens: 7 });
  svc.service.metrics.observeExecutorRestart();
  const raw = await fetch(svc.base + "/metrics");
  assertEquals(raw.headers.get("content-type"), PROMETHEUS_CONTENT_TYPE);
  await raw.body?.cancel();
  const text = await scrape(svc.base);
  const types = new Map<string, string>();
  for (const line of text.split("\n")) {
    if (line === "") continue;
    const t = /^# TYPE (\S+) (counter|gauge|histogram)$/.exec(line);
    if (t) types.set(t[1]!, t[2]!);
    else if (!line.startsWith("# HELP ")) {
      assertMatch(line, /^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? \S+$/);
    }
  }
  const want: Record<string, string> = {
    llm_time_to_first_token_seconds: "histogram",
    llm_inter_token_latency_seconds: "histogram",
    llm_e2e_request_latency_seconds: "histogram",
    llm_queue_time_seconds: "histogram",
    llm_step_duration_seconds: "histogram",
    llm_batch_size: "histogram",
    llm_requests_running: "gauge",
    llm_requests_waiting: "gauge",
    llm_kv_blocks_used: "gauge",
    llm_kv_blocks_capacity: "gauge",
    llm_prefix_cache_hit_rate: "gauge",
    llm_executor_busy_fraction: "gauge",
    llm_executor_healthy: "gauge",
    llm_inflight_generations: "gauge",
    llm_generation_tokens_total: "counter",
    llm_prompt_tokens_total: "counter",
    llm_generations_total: "counter",
    llm_errors_total: "counter",
    llm_http_requests_total: "counter",
    llm_executor_busy_seconds_total: "counter",
    llm_executor_restarts_total: "counter",
    llm_steps_total: "counter",
  };
  for (const [name, type] of Object.entries(want)) assertEquals(types.get(name), type, name);
  assertEquals(metricValue(text, "llm_generation_tokens_total"), 6);
  // "count me" in tok512 (run.c's encoding): [1, 280, 277, 361, 284, 411].
  assertEquals(metricValue(text, "llm_prompt_tokens_total"), 6);
  assertEquals(metricValue(text, "llm_time_to_first_token_seconds_count"), 1);
  assertEquals(metricValue(text, "llm_inter_token_latency_seconds_count"), 5);
  assertEquals(metricValue(text, "llm_e2e_request_latency_seconds_count"), 1);
  assertEquals(metricValue(text, "llm_queue_time_seconds_count"), 1);
  assertEquals(metricValue(text, 'llm_batch_size_bucket{le="8"}'), 1);
  assertEquals(metricValue(text, 'llm_batch_size_bucket{le="4"}'), 0);
  assertEquals(metricValue(text, "llm_step_duration_seconds_sum"), 0.012);
  assertEquals(metricValue(text, "llm_executor_restarts_total"), 1);
  assertEquals(metricValue(text, "llm_kv_blocks_capacity"), svc.backend.stats().kvBlocksTotal);
  assertEquals(
    metricValue(text, 'llm_generations_total{api="completions",finish_reason="length"}'),
    1,
  );
  assertEquals(
    metricValue(
      text,
      'llm_http_requests_total{method="POST",route="/v1/completions",status="200"}',
    ),
    1,
  );
});

Deno.test("ServiceMetrics reports the core's pipeline depth, and 0 where the backend gives none", () => {
  const stats = {
    running: 1,
    waiting: 0,
    kvBlocksUsed: 2,
    kvBlocksTotal: 8,
    prefixCacheHitRate: 0,
    steps: 3,
    lastBatchSize: 1,
    executorHealthy: true,
  };
  const m = new ServiceMetrics();
  m.setStats({ ...stats, pipelineDepth: 5 }, 1);
  assertEquals(metricValue(m.render(), "llm_pipeline_depth"), 5);
  const none = new ServiceMetrics();
  none.setStats(stats, 1);
  assertEquals(metricValue(none.render(), "llm_pipeline_depth"), 0);
});

Deno.test("/metrics has a 0..1 KV-usage gauge and the queued and running gauges an endpoint picker scrapes", async () => {
  await using svc = await startService(
    { tokenDelayMs: 5, maxRunning: 1, maxWaiting: 4, kvBlocksTotal: 10, kvBlockSize: 4 },
  );
  const idle = await scrape(svc.base);
  assertEquals(metricValue(idle, "llm_kv_cache_usage_ratio"), 0);
  const ctrl = new AbortController();
  const streams = [0, 1].map(() =>
    fetch(svc.base + "/v1/completions", {
      headers: { "content-type": "application/json" },
      method: "POST",
      body: JSON.stringify({ prompt: "a b c d e f g", max_tokens: 20, stream: true }),
      signal: ctrl.signal,
    })
  );
  const res = await Promise.all(streams);
  const readers = res.map((r) => r.body!.getReader());
  await readers[0]!.read();
  const busy = await scrape(svc.base);
  const stats = svc.backend.stats();
  assertEquals(stats.waiting, 1);
  assertEquals(metricValue(busy, "llm_requests_waiting"), 1);
  assertEquals(metricValue(busy, "llm_requests_running"), 1);
  const usage = metricValue(busy, "llm_kv_cache_usage_ratio")!;
  // The fake's blocks at scrape time, over its pool of 10 (not a percentage).
  assertEquals(usage, metricValue(busy, "llm_kv_blocks_used")! / 10);
  assert(usage > 0 && usage <= 1);
  ctrl.abort();
  for (const r of readers) await r.cancel().catch(() => {});
});

Deno.test("--metrics-public: Prometheus scrapes /metrics without a key while the API still needs one", async () => {
  for (const metricsPublic of [false, true]) {
    await using svc = await startService({}, { apiKeys: ["sk-metrics-key"], metricsPublic });
    const res = await fetch(svc.base + "/metrics");
    await res.body?.cancel();
    assertEquals(res.status, metricsPublic ? 200 : 401);
    const api = await postJson(svc.base + "/v1/completions", { prompt: "x" });
    await api.body?.cancel();
    assertEquals(api.status, 401);
  }
});
