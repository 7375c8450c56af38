import { HTTP_DEFAULTS } from "./defaults.ts";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import process from "node:process";
import { createAdaptorServer } from "@hono/node-server";
// @ts-types="@types/ws"
import { type WebSocket, WebSocketServer } from "ws";
import { context, propagation, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import type { DrainResult, ServiceApp } from "./app.ts";

export interface ServeOptions {
  readonly hostname: string;
  /** 0 picks a free port. */
  readonly port: number;
  /** How long in-flight generations get to finish after SIGTERM/SIGINT. */
  readonly drainTimeoutMs: number;
  /** Signals that start the drain (default SIGTERM and SIGINT). */
  readonly signals?: readonly Deno.Signal[];
  readonly onListen?: (addr: Deno.NetAddr) => void;
  /** Open client connections at most; past it new ones are closed at once (default 1024). */
  readonly maxConnections?: number;
  /** A request's headers must arrive within this, from the connection's start (default 60 s). */
  readonly headerTimeoutMs?: number;
  /** A whole request, headers and body, must arrive within this (default 60 s). */
  readonly bodyTimeoutMs?: number;
  /** An idle keep-alive connection is closed after this (default 5 s). */
  readonly keepAliveTimeoutMs?: number;
  /**
   * Hard cap on one WebSocket message: a frame announcing more is refused from its header,
   * before its payload is buffered, and the socket closed with 1009 (default 1 MiB). Frames
   * under it but over the app's own frame limit get a `frame_too_large` error frame.
   */
  readonly wsMaxPayloadBytes?: number;
  /** Reports accept errors and other server trouble (default: stderr). */
  readonly log?: (line: string) => void;
}

export interface RunningServer {
  readonly addr: Deno.NetAddr;
  /** Resolves once a signal (or stop()) has drained the service and the server is shut down. */
  readonly closed: Promise<DrainResult>;
  /** Drains and shuts down as a signal would. */
  stop(): Promise<DrainResult>;
  /** Client connections open now (HTTP and WebSocket). */
  readonly connections: number;
  /** Connections closed at once because `maxConnections` were open. */
  readonly refusedConnections: number;
}

/** How often idle and slow connections are checked against their timeouts. */
const CHECK_INTERVAL_MS = 1000;
/** How long past the drain's deadline (or a second signal) answers still get to be written. */
const WRITE_GRACE_MS = 400;

/**
 * Serves the app over node:http (Deno's implementation) and drains on SIGTERM/SIGINT.
 *
 * Deno.serve gives no hook on connections: no limit on how many are open, no header, body or
 * idle timeout, and an accept failing with EMFILE rejects a promise nobody can catch, which
 * ends the process. node:http has all of them (`maxConnections`, `headersTimeout`,
 * `requestTimeout`, `keepAliveTimeout`), and hands WebSocket upgrades to `ws`, whose
 * `maxPayload` refuses an oversized frame from its header, where Deno's WebSocket buffers up
 * to 64 MiB first.
 *
 * Drain: /ready turns 503, new generations and WebSocket upgrades are refused, in-flight ones
 * finish up to the deadline (then are aborted and get their final frame), WebSockets close
 * with 1001 and every connection is closed. A second signal during the drain cuts it short:
 * what is still running is aborted at once, as at the deadline.
 */
export function serveService(service: ServiceApp, opts: ServeOptions): Promise<RunningServer> {
  const log = opts.log ?? ((line: string) => console.error(line));
  const headerTimeoutMs = opts.headerTimeoutMs ?? HTTP_DEFAULTS.headerTimeoutSeconds * 1000;
  const bodyTimeoutMs = Math.max(
    opts.bodyTimeoutMs ?? HTTP_DEFAULTS.bodyTimeoutSeconds * 1000,
    headerTimeoutMs,
  );
  const wss = new WebSocketServer({
    noServer: true,
    maxPayload: opts.wsMaxPayloadBytes ?? HTTP_DEFAULTS.wsMaxPayloadBytes,
    perMessageDeflate: false,
  });
  const server = createAdaptorServer({
    fetch: withServerSpan(service.fetch),
    // Its lighter Request/Response would replace the globals for the whole process, and
    // Deno.serve (used elsewhere, e.g. by tests' own servers) refuses a foreign Response.
    overrideGlobalObjects: false,
    websocket: { server: wss as never },
    serverOptions: {
      headersTimeout: headerTimeoutMs,
      requestTimeout: bodyTimeoutMs,
      keepAliveTimeout: opts.keepAliveTimeoutMs ?? HTTP_DEFAULTS.keepAliveTimeoutSeconds * 1000,
      connectionsCheckingInterval: CHECK_INTERVAL_MS,
    },
  }) as Server;
  const maxConnections = opts.maxConnections ?? HTTP_DEFAULTS.maxConnections;
  const metrics = service.metrics;

  // Deno's node:http has maxConnections but neither counts nor reports what it drops, and its
  // headersTimeout starts with a request's first byte: a connection that never sends one is
  // held until it does. So both are done here, on the connection.
  const sockets = new Set<Socket>();
  let refused = 0;
  server.on("connection", (socket: Socket) => {
    acceptWatch.accepted(socket);
    if (acceptWatch.isProbe(socket)) {
      socket.destroy();
      return;
    }
    if (sockets.size >= maxConnections) {
      refused++;
      metrics.connectionsRefused.inc();
      acceptWatch.arm();
      socket.destroy();
      return;
    }
    sockets.add(socket);
    metrics.connections.set(sockets.size);
    waitingForRequest.set(
      socket,
      setTimeout(() => {
        metrics.connectionsTimedOut.inc();
        // A client trickling its head is told why (nginx and node:http answer 408); one
        // that does not read the answer is closed a moment later all the same.
        if (socket.writable && !socket.destroyed) {
          socket.end(
            `HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`,
          );
          setTimeout(() => socket.destroy(), 1000).unref?.();
        } else socket.destroy();
      }, headerTimeoutMs),
    );
    socket.once("close", () => {
      requestArrived(socket);
      sockets.delete(socket);
      metrics.connections.set(sockets.size);
    });
  });
  // A request's headers are in: from here node:http's own timeouts apply (keep-alive, body).
  // (Deno's node:http feeds its parser without emitting "data" on the socket.)
  const waitingForRequest = new Map<Socket, ReturnType<typeof setTimeout>>();
  const requestArrived = (socket: Socket) => {
    clearTimeout(waitingForRequest.get(socket));
    waitingForRequest.delete(socket);
  };
  // Responses not yet handed to the socket. A generation leaves the in-flight registry once its
  // consumer has its final event, before @hono/node-server has written the response: the drain
  // waits for these too, or closing the sockets cut finished answers (6 of 8 got nothing).
  const responses = new Set<ServerResponse>();
  let responsesIdle: (() => void) | undefined;
  server.on("request", (req: IncomingMessage, res: ServerResponse) => {
    requestArrived(req.socket);
    responses.add(res);
    const done = () => {
      if (responses.delete(res) && responses.size === 0) responsesIdle?.();
    };
    res.once("finish", done);
    res.once("close", done);
  });
  /** Resolves once every response has been written, or after `ms`. */
  const responsesWritten = (ms: number) =>
    new Promise<void>((resolve) => {
      if (responses.size === 0) return resolve();
      const timer = setTimeout(settle, ms);
      function settle() {
        clearTimeout(timer);
        responsesIdle = undefined;
        resolve();
      }
      responsesIdle = settle;
    });
  // Not server.on("upgrade"): @hono/node-server writes an upgrade's refusal only while it is
  // the sole "upgrade" listener. A refused upgrade's socket is closed anyway.
  wss.on("connection", (ws: WebSocket, req: IncomingMessage) => {
    requestArrived(req.socket);
    ws.on("error", (err: Error & { code?: string }) => {
      if (err.code !== "WS_ERR_UNSUPPORTED_MESSAGE_LENGTH") return;
      // ws has sent the 1009 close frame but resumes the socket and reads the refused
      // payload, discarding it, until the peer closes or 30 s pass: a client that keeps
      // sending makes the server read (and allocate for) all of it, and one that stops
      // reading stalls in its writes for those 30 s. Stop reading, and close the connection
      // once the close frame is handed to the kernel (Linux still delivers data queued
      // before the reset). After ws's own nextTick(resume), which would undo the pause.
      const socket = req.socket;
      process.nextTick(() => {
        socket.pause();
        socket.end(() => socket.destroy());
      });
    });
  });
  const acceptWatch = new AcceptWatch({
    hostname: opts.hostname,
    port: () => (server.address() as { port?: number } | null)?.port,
    room: () => sockets.size < maxConnections,
    relisten: (port, done) => {
      log("accept stalled after running out of descriptors; listening again");
      server.close();
      // The old listener's port may still be held for a moment: retry a bind that fails.
      const attempt = (left: number) => {
        const onFail = (err: Error) => {
          server.off("listening", onListening);
          if (left > 0) setTimeout(() => attempt(left - 1), 100);
          else {
            log(`cannot listen again on ${opts.hostname}:${port}: ${err.message}`);
            done();
          }
        };
        const onListening = () => {
          server.off("error", onFail);
          done();
        };
        server.once("error", onFail);
        server.once("listening", onListening);
        server.listen(port, opts.hostname);
      };
      attempt(50);
    },
  });
  // Its listener ignores upgrades to anything but WebSocket, so `Upgrade: h2c` (curl --http2,
  // Java's HttpClient) got no answer until the timeout. Ours stands in front of it, as the
  // sole listener, and refuses those with a 400 that says what to do.
  const honoUpgrade = server.listeners("upgrade") as Array<(...a: unknown[]) => void>;
  server.removeAllListeners("upgrade");
  server.on("upgrade", (req: IncomingMessage, socket: Socket, head: Uint8Array) => {
    const protocol = String(req.headers.upgrade ?? "");
    if (protocol.toLowerCase() === "websocket") {
      for (const l of honoUpgrade) l.call(server, req, socket, head);
      return;
    }
    requestArrived(socket);
    const body = JSON.stringify({
      error: {
        message: `Upgrade to ${JSON.stringify(protocol.slice(0, 40))} is not supported: this ` +
          "server speaks HTTP/1.1 (and WebSocket on /v1/stream); send the request without " +
          "'Upgrade' (curl: --http1.1)",
        type: "invalid_request_error",
        param: "upgrade",
        code: "invalid_request",
      },
    });
    socket.end(
      `HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${new TextEncoder().encode(body).length}\r\nConnection: close\r\n\r\n` +
        body,
    );
    setTimeout(() => socket.destroy(), 1000).unref?.();
  });
  // Past the listen, errors are accept failures (EMFILE, ENFILE): the server keeps serving
  // the connections it holds and accepts again once descriptors are free.
  let listening = false;
  let lastAcceptError = 0;
  const onError = (err: Error & { code?: string }) => {
    if (!listening) return;
    const now = Date.now();
    if (now - lastAcceptError > 1000) {
      log(`accept failed (${err.code ?? err.message}); still serving`);
    }
    lastAcceptError = now;
    acceptWatch.arm();
  };
  server.on("clientError", (err: Error & { code?: string }, socket: Socket) => {
    // node:http's default answer: 400, 408 or 431 as fits, then close.
    if (socket.writable && !socket.destroyed) {
      const status = err.code === "ERR_HTTP_REQUEST_TIMEOUT"
        ? "408 Request Timeout"
        : err.code === "HPE_HEADER_OVERFLOW"
        ? "431 Request Header Fields Too Large"
        : "400 Bad Request";
      socket.end(`HTTP/1.1 ${status}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`);
    }
    socket.destroy();
  });

  return new Promise<RunningServer>((resolve, reject) => {
    const onListenError = (err: Error & { code?: string }) => {
      const hint = err.code === "EADDRINUSE"
        ? "; stop the other server or pick another --port (0 picks a free one)"
        : "";
      wss.close();
      reject(
        new Error(`Cannot listen on ${opts.hostname}:${opts.port}: ${err.message}${hint}`, {
          cause: err,
        }),
      );
    };
    server.once("error", onListenError);
    server.on("error", onError);
    server.listen(opts.port, opts.hostname, () => {
      listening = true;
      server.off("error", onListenError);
      const a = server.address();
      const addr: Deno.NetAddr = {
        transport: "tcp",
        hostname: typeof a === "object" && a !== null ? a.address : opts.hostname,
        port: typeof a === "object" && a !== null ? a.port : opts.port,
      };
      resolve(running(addr));
      opts.onListen?.(addr);
    });
  });

  function running(addr: Deno.NetAddr): RunningServer {
    const signals = opts.signals ?? ["SIGTERM", "SIGINT"];
    let stopping: Promise<DrainResult> | undefined;
    let resolveClosed!: (r: DrainResult) => void;
    const closed = new Promise<DrainResult>((r) => resolveClosed = r);
    let hurried = false;
    const stop = (): Promise<DrainResult> => {
      stopping ??= (async () => {
        acceptWatch.close();
        const deadline = performance.now() + opts.drainTimeoutMs;
        const result = await service.drain({ timeoutMs: opts.drainTimeoutMs });
        // Finished answers (and the final frames of cut ones) still have to be written. A
        // client that does not read must not hold the exit past the deadline's extra second.
        const left = hurried ? 0 : Math.max(0, deadline - performance.now());
        await responsesWritten(left + WRITE_GRACE_MS);
        // The listeners stay: a signal that comes after the drain, while the caller closes the
        // core and exits, would otherwise end the process with Deno's default (exit 143).
        // Whatever is left holds no generation (a half-sent body, an idle keep-alive): close it.
        await new Promise<void>((done) => {
          server.close(() => done());
          server.closeAllConnections();
          for (const s of sockets) s.destroy();
        });
        wss.close();
        resolveClosed(result);
        return result;
      })();
      return stopping;
    };
    const onSignal = (signal: Deno.Signal) => {
      if (stopping === undefined) {
        log(
          `${signal}: draining for up to ${
            opts.drainTimeoutMs / 1000
          } s (another signal cuts it short); ${service.inFlight} generation(s) in flight`,
        );
        void stop();
      } else {
        log("second signal: cancelling what is still running");
        hurried = true;
        service.hurry();
      }
    };
    for (const s of signals) Deno.addSignalListener(s, () => onSignal(s));
    return {
      addr,
      closed,
      stop,
      get connections() {
        return sockets.size;
      },
      get refusedConnections() {
        return refused;
      },
    };
  }
}

/**
 * Deno 2.9.6's node:net stops accepting for good once an accept has failed for want of file
 * descriptors: new connections wait in the kernel's queue even after descriptors are free
 * again (reproduction: bench/repro/accept_stall.ts). Listening again on the same port mends
 * it. So after a connection was refused for the limit or an accept failed, this connects to
 * the server itself once a second while there is room; a probe not accepted within a second
 * means the stall, and the server listens again. It stops after a minute with nothing to mend.
 */
class AcceptWatch {
  static readonly PROBE_MS = 1000;
  static readonly ARMED_MS = 60_000;
  #probes = new Set<number>();
  #armedUntil = 0;
  #timer: ReturnType<typeof setInterval> | undefined;
  #busy = false;
  #closed = false;
  #lastAccept = performance.now();

  constructor(
    private readonly o: {
      hostname: string;
      port: () => number | undefined;
      room: () => boolean;
      relisten: (port: number, done: () => void) => void;
    },
  ) {}

  accepted(_socket: Socket): void {
    this.#lastAccept = performance.now();
  }

  /** A connection the watch itself made (told apart by its local port, the probe's). */
  isProbe(socket: Socket): boolean {
    const port = socket.remotePort;
    return port !== undefined && this.#probes.delete(port);
  }

  arm(): void {
    if (this.#closed) return;
    this.#armedUntil = performance.now() + AcceptWatch.ARMED_MS;
    this.#timer ??= setInterval(() => void this.#check(), AcceptWatch.PROBE_MS);
  }

  close(): void {
    this.#closed = true;
    clearInterval(this.#timer);
    this.#timer = undefined;
  }

  async #check(): Promise<void> {
    if (performance.now() > this.#armedUntil) {
      clearInterval(this.#timer);
      this.#timer = undefined;
      return;
    }
    const port = this.o.port();
    if (this.#busy || port === undefined || !this.o.room()) return;
    this.#busy = true;
    let conn: Deno.TcpConn | undefined;
    try {
      conn = await Deno.connect({ hostname: this.o.hostname, port });
      const local = conn.localAddr.port;
      this.#probes.add(local);
      const sent = performance.now();
      while (this.#probes.has(local) && performance.now() - sent < AcceptWatch.PROBE_MS) {
        await new Promise((r) => setTimeout(r, 20));
      }
      if (this.#probes.delete(local) && this.#lastAccept < sent && !this.#closed) {
        await new Promise<void>((done) => this.o.relisten(port, done));
      }
    } catch {
      // No descriptor for the probe itself: try again at the next tick.
    } finally {
      try {
        conn?.close();
      } catch { /* closed by the server */ }
      this.#busy = false;
    }
  }
}

type Fetch = ServiceApp["fetch"];

const HEADER_GETTER = {
  get: (h: Headers, key: string) => h.get(key) ?? undefined,
  keys: (h: Headers) => [...h.keys()],
};

/**
 * The HTTP server span Deno.serve makes by itself (under OTEL_DENO), made here for node:http:
 * named by the method, continuing a caller's `traceparent`, and active while the handler runs
 * so the request span (llm.request) is its child.
 */
export function withServerSpan(fetch: Fetch): Fetch {
  const tracer = trace.getTracer("llmserve.http");
  return async (req, env) => {
    const parent = propagation.extract(context.active(), req.headers, HEADER_GETTER);
    const url = new URL(req.url);
    const span = tracer.startSpan(req.method, {
      kind: SpanKind.SERVER,
      attributes: {
        "http.request.method": req.method,
        "url.path": url.pathname,
        "url.scheme": url.protocol.replace(":", ""),
      },
    }, parent);
    try {
      const res = await context.with(trace.setSpan(parent, span), () => fetch(req, env));
      span.setAttribute("http.response.status_code", res.status);
      if (res.status >= 500) span.setStatus({ code: SpanStatusCode.ERROR });
      return res;
    } catch (err) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: String(err) });
      throw err;
    } finally {
      span.end();
    }
  };
}
