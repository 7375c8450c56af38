/** A tracer and span that record what the code under test did to them (no SDK, no export). */
import {
  type Attributes,
  type Context,
  context,
  type Span,
  type SpanContext,
  type SpanOptions,
  type SpanStatus,
  trace,
  type Tracer,
} from "@opentelemetry/api";

/** A span that only records what the code under test did to it. */
export class RecordedSpan implements Span {
  attributes: Attributes = {};
  /** How often each key was set: a key set twice is dropped by some OTLP receivers. */
  setCounts = new Map<string, number>();
  events: string[] = [];
  status: SpanStatus | undefined;
  ended = false;
  endTime: number | undefined;
  readonly #ctx: SpanContext;

  constructor(
    readonly name: string,
    readonly parent: RecordedSpan | undefined,
    readonly startTime: number | undefined,
    id: number,
  ) {
    this.#ctx = {
      traceId: "0".repeat(31) + "1",
      spanId: id.toString(16).padStart(16, "0"),
      traceFlags: 1,
    };
  }
  spanContext(): SpanContext {
    return this.#ctx;
  }
  setAttribute(k: string, v: unknown): this {
    this.setCounts.set(k, (this.setCounts.get(k) ?? 0) + 1);
    this.attributes[k] = v as string;
    return this;
  }
  setAttributes(a: Attributes): this {
    for (const [k, v] of Object.entries(a)) this.setAttribute(k, v);
    return this;
  }
  addEvent(name: string): this {
    this.events.push(name);
    return this;
  }
  addLink(): this {
    return this;
  }
  addLinks(): this {
    return this;
  }
  setStatus(s: SpanStatus): this {
    this.status = s;
    return this;
  }
  updateName(): this {
    return this;
  }
  end(t?: unknown): void {
    this.ended = true;
    this.endTime = typeof t === "number" ? t : undefined;
  }
  isRecording(): boolean {
    return true;
  }
  recordException(): void {}
}

export class RecordingTracer implements Tracer {
  spans: RecordedSpan[] = [];
  startSpan(name: string, options?: SpanOptions, ctx?: Context): Span {
    const parent = trace.getSpan(ctx ?? context.active());
    const span = new RecordedSpan(
      name,
      parent instanceof RecordedSpan ? parent : undefined,
      typeof options?.startTime === "number" ? options.startTime : undefined,
      this.spans.length + 1,
    );
    span.setAttributes(options?.attributes ?? {});
    this.spans.push(span);
    return span;
  }
  startActiveSpan(): never {
    throw new Error("not used by the HTTP layer");
  }
}
