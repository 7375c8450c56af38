/** Test helper: a local OTLP/JSON endpoint that keeps every span Deno's exporter sends it. */

export interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  attributes?: Array<{ key: string; value: Record<string, unknown> }>;
  events?: Array<{ name: string }>;
  links?: Array<{ traceId: string; spanId: string }>;
  /** code 2 is an error, with its message. */
  status?: { code?: number; message?: string };
}

/** An attribute's value as text (OTLP wraps it as {stringValue} / {intValue} / ...). */
export function otlpAttr(span: OtlpSpan, key: string): string | undefined {
  const v = span.attributes?.find((a) => a.key === key)?.value;
  return v === undefined ? undefined : String(Object.values(v)[0]);
}

/** Listens on a free loopback port; pass `env` to the process whose spans you want. */
export function startOtlpCollector(): {
  spans: OtlpSpan[];
  env: Record<string, string>;
  close(): Promise<void>;
} {
  const spans: OtlpSpan[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (req) => {
    if (new URL(req.url).pathname === "/v1/traces") {
      const body = await req.json();
      for (const rs of body.resourceSpans ?? []) {
        for (const ss of rs.scopeSpans ?? []) spans.push(...(ss.spans ?? []));
      }
    } else await req.body?.cancel();
    return Response.json({});
  });
  return {
    spans,
    env: {
      OTEL_DENO: "true",
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${(server.addr as Deno.NetAddr).port}`,
      OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
    },
    close: () => server.shutdown(),
  };
}
