/**
 * The one source of the HTTP layer's defaults: the app, the listener, the several-models front
 * and the settings table (and so `--help`) all read them from here, like the engine's limits in
 * lib/engine/limits.ts.
 */
export const HTTP_DEFAULTS = {
  /** Largest request body read (JSON or multipart), and what /props reports. */
  maxBodyBytes: 1 << 20,
  /** Largest WebSocket frame a client may send; `ws` refuses a larger one from its header. */
  wsMaxPayloadBytes: 1 << 20,
  /** Bytes queued on a WebSocket before its generations wait for the client to read. */
  wsHighWaterBytes: 1 << 20,
  /** ...and they resume below this share of it. */
  wsLowWaterFraction: 1 / 4,
  /** Largest frame a WebSocket client may send that the session reads. */
  maxFrameBytes: 256 * 1024,
  /** Live generations on one socket. */
  maxGenerationsPerSocket: 64,
  /** WebSockets one client address may hold open; past it an upgrade gets 429. */
  wsMaxPerClient: 256,
  /** A socket (or an SSE stream) congested this long is closed and its generations cancelled. */
  wsStallTimeoutMs: 60_000,
  /** A WebSocket with no frame and no generation for this long is closed. */
  wsIdleTimeoutMs: 300_000,
  /** Period of `stats` frames to subscribed sockets. */
  statsIntervalMs: 500,
  /** Retry-After seconds on 503 overloaded or draining. */
  retryAfterSeconds: 1,
  /** max_tokens of /v1/completions when the client gives none (OpenAI's). */
  defaultCompletionMaxTokens: 16,
  /** Paths served without an API key. */
  openPaths: ["/", "/health", "/ready"],
  /** Seconds a connection has to send a request's headers. */
  headerTimeoutSeconds: 60,
  /** Seconds a whole request may take to arrive (at least the header timeout). */
  bodyTimeoutSeconds: 60,
  /**
   * A body refused from its declared length is still read (and dropped) up to these bytes and
   * milliseconds before the 413 is sent: a connection closed with unread bytes is reset, and the
   * reset can destroy the 413 before the client reads it (nginx's lingering close, for the same
   * reason). A bigger or slower body gets the 413 and the close.
   */
  refusedBodyDrainBytes: 64 << 20,
  refusedBodyDrainMs: 5_000,
  /** Seconds an idle keep-alive connection is kept. */
  keepAliveTimeoutSeconds: 5,
  /** Seconds in-flight requests may run on after SIGTERM. */
  drainTimeoutSeconds: 30,
  /** Open client connections, where nothing says otherwise (the CLI derives it from the open-file limit). */
  maxConnections: 1024,
} as const;
