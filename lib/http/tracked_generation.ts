import { context, type Span, SpanStatusCode, trace, type Tracer } from "@opentelemetry/api";
import type { GenerationBackend, GenerationEvent, GenerationRequest } from "../core/generation.ts";
import type { InFlightRegistry } from "./inflight.ts";
import type { RequestLog, RequestRecord } from "./request_log.ts";
import type { ServiceMetrics } from "./service_metrics.ts";
import { DRAINING_EVENT } from "../core/draining.ts";

/** Which API a generation came through (a metrics label and span attribute). */
export type Api =
  | "completions"
  | "chat_completions"
  | "stream"
  | "ollama"
  | "messages"
  | "responses";

export interface GenerationDeps {
  readonly backend: GenerationBackend;
  readonly metrics: ServiceMetrics;
  readonly tracer: Tracer;
  readonly inflight: InFlightRegistry;
  readonly isDraining: () => boolean;
  readonly requestLog: RequestLog;
}

/**
 * Runs one generation on the core and passes its events through, doing the bookkeeping every
 * API shares: refusing new work while draining, registering it as in flight (so drain can wait
 * for it or abort it), latency metrics, and the request span.
 *
 * The span ("llm.request") gets events `queued`, `started`, `first_token` and ends with the
 * finish reason; when the core reports timings, child spans `queued`, `prefill` and `decode`
 * are recorded from them. The core's next() calls run with the request span active, so the
 * core can link its step spans to `trace.getActiveSpan()`.
 *
 * The consumer must keep pulling after aborting `signal`: the core answers an abort with a
 * final "done" (finish reason "cancelled").
 */
export async function* trackGeneration(
  deps: GenerationDeps,
  request: GenerationRequest,
  api: Api,
  signal: AbortSignal,
  /** The request-log line this generation fills in (tokens, TTFT, cache, error code). */
  record?: RequestRecord,
): AsyncGenerator<GenerationEvent> {
  if (deps.isDraining()) {
    if (record) record.code = "draining";
    yield DRAINING_EVENT;
    return;
  }
  const { metrics } = deps;
  const entry = deps.inflight.begin(signal);
  const t0 = performance.now();
  const t0Epoch = Date.now();
  const span = deps.tracer.startSpan("llm.request", {
    attributes: {
      "llm.request.id": request.requestId,
      "llm.api": api,
      "llm.priority": request.priority,
      "gen_ai.request.model": deps.backend.modelName,
      "gen_ai.request.max_tokens": request.maxTokens,
      "gen_ai.request.temperature": request.sampling.temperature,
      "gen_ai.request.top_p": request.sampling.topP,
      "gen_ai.request.top_k": request.sampling.topK,
    },
  });
  span.addEvent("queued");
  const ctx = trace.setSpan(context.active(), span);
  let lastTokenAt = -1;
  let completionTokens = 0;
  let outcome: "done" | "error" | "abandoned" = "abandoned";
  let iterator: AsyncIterator<GenerationEvent> | undefined;
  const next = async (): Promise<IteratorResult<GenerationEvent>> => {
    try {
      iterator ??= context.with(ctx, () => deps.backend.generate(request, entry.signal))
        [Symbol.asyncIterator]();
      const it = iterator;
      return await context.with(ctx, () => it.next());
    } catch (err) {
      // A core that throws is answered like one that sent an error event.
      const detail = err instanceof Error ? err.message : String(err);
      return { done: false, value: { type: "error", code: "internal", message: detail } };
    }
  };
  try {
    for (;;) {
      const step = await next();
      if (step.done) break;
      const ev = step.value;
      const now = performance.now();
      switch (ev.type) {
        case "started":
          if (record) record.promptTokens = ev.promptTokens;
          metrics.promptTokens.inc(undefined, ev.promptTokens);
          span.setAttribute("gen_ai.usage.input_tokens", ev.promptTokens);
          span.addEvent("started", { "llm.prompt_tokens": ev.promptTokens });
          break;
        case "token":
          if (lastTokenAt < 0) {
            metrics.timeToFirstToken.observe((now - t0) / 1000);
            span.addEvent("first_token");
          } else {
            metrics.interTokenLatency.observe((now - lastTokenAt) / 1000);
          }
          lastTokenAt = now;
          record?.firstToken();
          completionTokens += ev.ids.length;
          metrics.generatedTokens.inc(undefined, ev.ids.length);
          break;
        case "done":
          outcome = "done";
          if (record) {
            record.completionTokens = ev.usage.completionTokens;
            record.cached = ev.cached !== undefined;
          }
          if (ev.cached !== undefined) span.setAttribute("llm.result_cache.hit", true);
          metrics.endToEnd.observe((now - t0) / 1000);
          metrics.queueTime.observe(ev.timings.queuedMs / 1000);
          metrics.generations.inc({ api, finish_reason: ev.finishReason });
          finishSpan(span, deps.tracer, ctx, t0Epoch, ev);
          break;
        case "error":
          outcome = "error";
          if (record) record.code = ev.code;
          metrics.generations.inc({ api, finish_reason: "error" });
          span.setAttribute("llm.error.code", ev.code);
          span.setStatus({ code: SpanStatusCode.ERROR, message: ev.message });
          break;
      }
      yield ev;
      if (ev.type === "done" || ev.type === "error") break;
    }
  } finally {
    if (outcome === "abandoned") {
      // The consumer left (client gone) before the core said "done".
      entry.abort("client gone");
      if (record) record.completionTokens = completionTokens;
      metrics.generations.inc({ api, finish_reason: "cancelled" });
      span.setAttribute("gen_ai.usage.output_tokens", completionTokens);
      span.setAttribute("gen_ai.response.finish_reasons", ["cancelled"]);
    }
    // The consumer has handled the final event (it pulled again or returned): the client has
    // its answer, so the generation is no longer in flight even though the core may still be
    // releasing its sequence below. Ending the entry only after that let
    // llm_inflight_generations count finished generations (258 with 256 submitted) and made a
    // drain wait on work no client was waiting for.
    if (outcome !== "abandoned") entry.end();
    // Also after "done": the core's generator may still be parked at that yield, holding
    // resources its finally block releases.
    try {
      await iterator?.return?.();
    } catch {
      // The core failed while ending; its error (if any) was already reported.
    } finally {
      entry.end();
      span.end();
    }
  }
}

function finishSpan(
  span: Span,
  tracer: Tracer,
  ctx: ReturnType<typeof context.active>,
  t0Epoch: number,
  ev: Extract<GenerationEvent, { type: "done" }>,
): void {
  // input_tokens was set once at "started": some OTLP receivers drop a batch with a key twice.
  span.setAttribute("gen_ai.usage.output_tokens", ev.usage.completionTokens);
  span.setAttribute("llm.usage.cached_tokens", ev.usage.cachedTokens);
  span.setAttribute("gen_ai.response.finish_reasons", [ev.finishReason]);
  span.setAttribute("llm.finish_reason", ev.finishReason);
  span.addEvent("done", { "llm.finish_reason": ev.finishReason });
  const t = ev.timings;
  const phases: Array<[string, number, number]> = [
    ["queued", 0, t.queuedMs],
    ["prefill", t.queuedMs, t.queuedMs + t.prefillMs],
    ["decode", t.queuedMs + t.prefillMs, t.totalMs],
  ];
  for (const [name, from, to] of phases) {
    if (!(to >= from)) continue;
    tracer.startSpan(name, { startTime: t0Epoch + from }, ctx).end(t0Epoch + to);
  }
}
