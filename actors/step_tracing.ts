import { type Link, type SpanContext, trace, type Tracer } from "@opentelemetry/api";
import type { StepReport } from "./executor.ts";
import { stepTokens } from "../lib/engine/engine.ts";

/**
 * Emits one "llm.step" span per executor step, linked to the request spans of the sequences
 * it served. A step serves many requests and a request spans many steps, so links (not
 * parent/child) are the honest shape. Without an OpenTelemetry SDK (OTEL_DENO unset) the
 * tracer is a no-op and this costs a map lookup per sequence.
 */
export class StepTracer {
  readonly #requests = new Map<number, SpanContext>();
  readonly #tracer: Tracer;

  constructor(tracer: Tracer = trace.getTracer("llmserve")) {
    this.#tracer = tracer;
  }

  /** Remembers the span active while a sequence is created (the HTTP layer's request span). */
  bind(seqId: number): void {
    const ctx = trace.getActiveSpan()?.spanContext();
    if (ctx) this.#requests.set(seqId, ctx);
  }

  unbind(seqId: number): void {
    this.#requests.delete(seqId);
  }

  /** Links to the request spans of these sequences (those bound). */
  links(seqIds: readonly number[]): Link[] {
    return seqIds.flatMap((id) => {
      const context = this.#requests.get(id);
      return context ? [{ context }] : [];
    });
  }

  record(report: StepReport): void {
    const { plan } = report;
    const links = this.links(plan.seqs.map((s) => s.seqId));
    const tokens = stepTokens(plan);
    const start = performance.timeOrigin + report.startedAt;
    const span = this.#tracer.startSpan("llm.step", {
      startTime: start,
      links,
      attributes: {
        "llm.step.id": plan.stepId,
        "llm.batch_size": plan.seqs.length,
        "llm.step.tokens": tokens,
        "llm.step.prefill_seqs": plan.seqs.filter((s) => s.tokens.length > 1).length,
      },
    });
    if (report.error !== undefined) span.recordException(report.error as Error);
    span.end(start + report.durationMs);
  }
}
