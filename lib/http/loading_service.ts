import type { DrainResult, ServiceApp } from "./app.ts";
import { HTTP_DEFAULTS } from "./defaults.ts";
import { ApiError } from "./errors.ts";
import { frontDoor, type FrontDoorOptions } from "./front_door.ts";

/** What the server is doing before it can serve: the order start-up goes through. */
export type LoadPhase =
  | "resolving"
  | "downloading"
  | "reading"
  | "building_engine"
  | "warming_up"
  | "ready";

/** How far start-up has got, as /health reports it while the model loads. */
export class LoadProgress {
  phase: LoadPhase = "resolving";
  bytes = 0;
  totalBytes: number | undefined;
  readonly #t0 = performance.now();

  set(phase: LoadPhase, bytes = 0, totalBytes?: number): void {
    this.phase = phase;
    this.bytes = bytes;
    this.totalBytes = totalBytes;
  }

  toJSON() {
    const t = this.totalBytes;
    return {
      phase: this.phase,
      // The share of the current phase's bytes (downloading, reading), null when unknown.
      progress: t !== undefined && t > 0 ? Math.min(1, this.bytes / t) : null,
      bytes: this.bytes,
      total_bytes: t ?? null,
      elapsed_s: Math.round(performance.now() - this.#t0) / 1000,
    };
  }
}

/**
 * The service while the model loads, so the port is bound (and a port in use reported) before
 * any slow work: GET /health answers 200 with the phase and progress, GET /ready 503, anything
 * else 503 `loading` with Retry-After. Behind the front door (front_door.ts) as the loaded
 * server is: the same Host, Origin and key checks, request-log lines and error answers.
 */
export function createLoadingService(
  progress: LoadProgress,
  o: Omit<FrontDoorOptions, "maxBodyBytes">,
): ServiceApp {
  const { app, respond } = frontDoor({ ...o, maxBodyBytes: HTTP_DEFAULTS.maxBodyBytes });
  app.get("/health", (c) => c.json({ status: "loading", ...progress.toJSON() }));
  app.get("/ready", (c) =>
    c.json(
      {
        status: "unavailable",
        reasons: [`model loading (${progress.phase})`],
        ...progress.toJSON(),
      },
      503,
    ));
  app.notFound((c) =>
    respond(
      new ApiError(
        "loading",
        `The model is still loading (${progress.phase}); retry shortly, or poll GET /ready`,
      ),
      c.req.raw,
    )
  );
  const done: DrainResult = { completed: true, aborted: 0 };
  return {
    app,
    fetch: (req, info) => app.fetch(req, info as never),
    metrics: o.metrics,
    drain: () => Promise.resolve(done),
    hurry() {},
    setReady() {},
    draining: false,
    inFlight: 0,
    sockets: 0,
    close() {},
  };
}

/**
 * A ServiceApp that forwards to another one, replaceable at run time: the loading service
 * first, the real one once the model is ready. serveService holds this one throughout.
 */
export class SwitchableService implements ServiceApp {
  #current: ServiceApp;

  constructor(initial: ServiceApp) {
    this.#current = initial;
  }

  switchTo(next: ServiceApp): void {
    this.#current = next;
  }

  get app() {
    return this.#current.app;
  }
  readonly fetch = (req: Request, info?: unknown) => this.#current.fetch(req, info);
  get metrics() {
    return this.#current.metrics;
  }
  hurry(): void {
    this.#current.hurry();
  }
  drain(opts?: { timeoutMs?: number }) {
    return this.#current.drain(opts);
  }
  setReady(ready: boolean) {
    this.#current.setReady(ready);
  }
  get draining() {
    return this.#current.draining;
  }
  get inFlight() {
    return this.#current.inFlight;
  }
  get sockets() {
    return this.#current.sockets;
  }
  close() {
    this.#current.close();
  }
}
