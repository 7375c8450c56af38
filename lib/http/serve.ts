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
}

export interface RunningServer {
  readonly addr: Deno.NetAddr;
  /** Resolves once a signal (or stop()) has drained the service and the server is shut down. */
  readonly closed: Promise<DrainResult>;
  /** Drains and shuts down as a signal would. */
  stop(): Promise<DrainResult>;
}

/**
 * Serves the app with Deno.serve and drains on SIGTERM/SIGINT: /ready turns 503, new
 * generations are refused, in-flight ones finish up to the deadline (then are aborted),
 * WebSockets close with 1001 and the listener shuts down. The caller exits after `closed`.
 */
export function serveService(service: ServiceApp, opts: ServeOptions): RunningServer {
  let server: Deno.HttpServer;
  try {
    server = Deno.serve({
      hostname: opts.hostname,
      port: opts.port,
      onListen: (addr) => opts.onListen?.(addr as Deno.NetAddr),
    }, service.fetch);
  } catch (err) {
    // Deno's own message ("Address already in use (os error 98)") names neither address.
    const hint = err instanceof Deno.errors.AddrInUse
      ? "; stop the other server or pick another --port (0 picks a free one)"
      : "";
    throw new Error(
      `Cannot listen on ${opts.hostname}:${opts.port}: ${
        err instanceof Error ? err.message : String(err)
      }${hint}`,
      { cause: err },
    );
  }
  const signals = opts.signals ?? ["SIGTERM", "SIGINT"];
  let stopping: Promise<DrainResult> | undefined;
  let resolveClosed!: (r: DrainResult) => void;
  const closed = new Promise<DrainResult>((r) => resolveClosed = r);
  const stop = (): Promise<DrainResult> => {
    stopping ??= (async () => {
      // The listeners stay until the end: a repeated signal (a terminal's Ctrl-C reaching
      // both a launcher and the server, a supervisor signalling the whole group) must not fall
      // back to the default action and kill the drain; --drain-timeout bounds it instead.
      const result = await service.drain({ timeoutMs: opts.drainTimeoutMs });
      await server.shutdown();
      for (const s of signals) Deno.removeSignalListener(s, onSignal);
      resolveClosed(result);
      return result;
    })();
    return stopping;
  };
  const onSignal = () => void stop();
  for (const s of signals) Deno.addSignalListener(s, onSignal);
  return { addr: server.addr as Deno.NetAddr, closed, stop };
}
