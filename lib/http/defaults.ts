/**
 * The one source of the HTTP layer's defaults: the app, the listener, the several-models front
 * and the configuration schema (and so `--help`) all read them from here, like the serving
 * limits in lib/engine/limits.ts.
 */
export const HTTP_DEFAULTS = {
  /** Largest request body read (JSON or multipart), and what /props reports. */
  maxBodyBytes: 1 << 20,
  /** Largest WebSocket frame a client may send; `ws` refuses a larger one from its header. */
  wsMaxPayloadBytes: 1 << 20,
  /** Bytes queued on a WebSocket before its generations wait for the client to read. */
  wsHighWaterBytes: 1 << 20,
  /** Seconds a connection has to send a request's headers. */
  headerTimeoutSeconds: 60,
  /** Seconds a whole request may take to arrive (at least the header timeout). */
  bodyTimeoutSeconds: 60,
  /** Seconds an idle keep-alive connection is kept. */
  keepAliveTimeoutSeconds: 5,
  /** Seconds in-flight requests may run on after SIGTERM. */
  drainTimeoutSeconds: 30,
  /** Open client connections, where nothing says otherwise (the CLI derives it from the open-file limit). */
  maxConnections: 1024,
} as const;
