/**
 * The request log: one line per HTTP request and per WebSocket generation, on stderr, as
 * `text` (key=value pairs, for people) or `json` (one JSON object per line, for log shippers).
 * A streamed response's line is written when its stream ends, so it has the token counts and
 * the total time.
 */

import { type LogLevel, logs } from "../util/log_level.ts";

/** `off` writes nothing (for benchmarks that measure the server, not its logging). */
export type LogFormat = "text" | "json" | "off";

/** What one line says. Token fields are absent for requests that generated nothing. */
export interface RequestLogEntry {
  readonly time: string;
  readonly request_id: string;
  readonly method: string;
  readonly route: string;
  /** The path asked for, where no route matched (the route is then "unmatched"). */
  readonly path?: string;
  readonly status: number;
  /** The error code, for failures. */
  readonly code?: string;
  readonly prompt_tokens?: number;
  readonly completion_tokens?: number;
  readonly ttft_ms?: number;
  readonly total_ms: number;
  readonly cached?: boolean;
}

/** Accepted `x-request-id` values: 1–128 visible ASCII characters (no spaces or controls). */
const REQUEST_ID = /^[\x21-\x7e]{1,128}$/;

export function isValidRequestId(id: string): boolean {
  return REQUEST_ID.test(id);
}

export function newRequestId(): string {
  return crypto.randomUUID().replaceAll("-", "");
}

/**
 * The facts about one request, filled in as it runs: by the route (tokens, TTFT, cache) and by
 * the app's middleware (status). It is written once: when the response is complete, or, for a
 * streamed response marked `deferred`, when both the response and the stream are done.
 */
export class RequestRecord {
  readonly startedAt = performance.now();
  status = 0;
  code: string | undefined;
  promptTokens: number | undefined;
  completionTokens: number | undefined;
  ttftMs: number | undefined;
  cached: boolean | undefined;
  /** Set where no route matched: the path, which the bounded route label cannot say. */
  path: string | undefined;
  #deferred = false;
  #responded = false;
  #streamEnded = false;
  #written = false;
  #passedOn = false;

  constructor(
    private readonly log: RequestLog,
    /** The client's x-request-id, or one made up; a route may name it while it is `generated`. */
    public id: string,
    readonly method: string,
    readonly route: string,
    readonly generated = false,
  ) {}

  /**
   * Another app answers it (a model's app behind the front of several models), and that app
   * writes its line and counts it: the front writes and counts nothing for it.
   */
  passOn(): void {
    this.#passedOn = this.#written = true;
  }

  get passedOn(): boolean {
    return this.#passedOn;
  }

  /** The response body is a stream: the line waits for streamEnded(). */
  defer(): void {
    this.#deferred = true;
  }

  /** The first token reached the client. */
  firstToken(): void {
    this.ttftMs ??= performance.now() - this.startedAt;
  }

  responded(status: number): void {
    this.status = status;
    this.#responded = true;
    if (!this.#deferred || this.#streamEnded) this.#write();
  }

  streamEnded(): void {
    this.#streamEnded = true;
    if (this.#responded) this.#write();
  }

  #write(): void {
    if (this.#written) return;
    this.#written = true;
    const round = (ms: number) => Math.round(ms * 10) / 10;
    this.log.write({
      time: new Date().toISOString(),
      request_id: this.id,
      method: this.method,
      route: this.route,
      ...(this.path !== undefined ? { path: this.path.slice(0, MAX_LOGGED_PATH) } : {}),
      status: this.status,
      ...(this.code !== undefined ? { code: this.code } : {}),
      ...(this.promptTokens !== undefined ? { prompt_tokens: this.promptTokens } : {}),
      ...(this.completionTokens !== undefined ? { completion_tokens: this.completionTokens } : {}),
      ...(this.ttftMs !== undefined ? { ttft_ms: round(this.ttftMs) } : {}),
      total_ms: round(performance.now() - this.startedAt),
      ...(this.cached !== undefined ? { cached: this.cached } : {}),
    });
  }
}

/** A longer unmatched path is cut to this many characters in its log line. */
const MAX_LOGGED_PATH = 200;

/** Routes that load balancers and orchestrators poll every few seconds. */
export const PROBE_ROUTES: ReadonlySet<string> = new Set(["/health", "/ready", "/metrics"]);

export interface RequestLogOptions {
  /** `--log-level`: a line is `warn` for a 5xx, else `info`; a successful probe is `debug`. */
  readonly level?: LogLevel;
  /**
   * `--log-probes`: log successful probes at `info` too. Off by default because a probe every
   * few seconds buries the requests; a failed probe (503 while draining, 401) is always logged.
   */
  readonly probes?: boolean;
}

/** The level of a request's line. */
export function requestLineLevel(e: RequestLogEntry, probes = false): LogLevel {
  if (e.status >= 500) return "warn";
  if (!probes && e.status < 400 && PROBE_ROUTES.has(e.route)) return "debug";
  return "info";
}

export class RequestLog {
  readonly #level: LogLevel;
  readonly #probes: boolean;

  constructor(
    readonly format: LogFormat = "text",
    private readonly sink: (line: string) => void = (line) => console.error(line),
    opts: RequestLogOptions = {},
  ) {
    this.#level = opts.level ?? "info";
    this.#probes = opts.probes ?? false;
  }

  record(id: string, method: string, route: string, generated = false): RequestRecord {
    return new RequestRecord(this, id, method, route, generated);
  }

  write(e: RequestLogEntry): void {
    if (this.format === "off") return;
    if (!logs(this.#level, requestLineLevel(e, this.#probes))) return;
    this.sink(this.format === "json" ? JSON.stringify(e) : formatText(e));
  }
}

/** `2026-12-01T09:00:00.000Z POST /v1/completions 200 id=… prompt=5 completion=16 ttft=3.1ms total=40.2ms` */
export function formatText(e: RequestLogEntry): string {
  const parts = [e.time, e.method, e.route];
  if (e.path !== undefined) parts.push(`path=${logSafe(e.path)}`);
  parts.push(String(e.status));
  if (e.code !== undefined) parts.push(`code=${e.code}`);
  parts.push(`id=${logSafe(e.request_id)}`);
  if (e.prompt_tokens !== undefined) parts.push(`prompt=${e.prompt_tokens}`);
  if (e.completion_tokens !== undefined) parts.push(`completion=${e.completion_tokens}`);
  if (e.ttft_ms !== undefined) parts.push(`ttft=${e.ttft_ms}ms`);
  parts.push(`total=${e.total_ms}ms`);
  if (e.cached !== undefined) parts.push(`cached=${e.cached}`);
  return parts.join(" ");
}

/**
 * A client-chosen value as one token of a text log line: WebSocket generation ids are the
 * client's, and unescaped a newline in one forged a line and an ESC recoloured the terminal.
 * Values of plain visible characters stay as they are; anything else is written as JSON.
 */
function logSafe(value: string): string {
  return /^[\x21-\x7e]*$/.test(value) && !value.includes('"') ? value : JSON.stringify(value);
}
