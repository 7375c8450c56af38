/**
 * The models one server can serve, each unloaded, loading or loaded, and the one object that
 * decides when each is loaded and unloaded: a request's first use loads a model (concurrent
 * first requests share that load), an idle model stays warm for its keep-alive, and a load that
 * needs memory unloads the least recently used idle ones. A model with requests running or
 * waiting is never unloaded; one kept forever (keep_alive -1, where --max-keep-alive allows it)
 * is unloaded only at shutdown.
 *
 * Keep-alive is kept per tenant (API key): each tenant's latest request sets how long that
 * tenant wants the model kept after its own last use (Ollama's rule, where the last request's
 * keep_alive wins), and the model stays loaded until the latest of those. So a tenant can
 * shorten only its own wish: keep_alive 0 from one key does not unload a model another key
 * asked to keep. Without keys every request is one tenant's, exactly as in Ollama.
 */

import { formatKeepAlive } from "../util/duration.ts";
import {
  type Lease,
  ModelLoadError,
  type ModelPhase,
  type ModelStatus,
  type PooledModel,
  type Residue,
} from "../http/model_directory.ts";

/** What a loader may tell the pool while it loads. */
export interface LoadContext {
  /** Bytes read so far of the file (for /health and the waiting requests). */
  progress(bytes: number, total?: number): void;
  /**
   * The memory the load now knows it will hold (e.g. once the KV cache is planned): the pool
   * unloads idle models to make room, or throws an InsufficientMemory error to fail the load.
   */
  reserve(bytes: number): void;
}

export type Loader<S> = (name: string, ctx: LoadContext) => Promise<PooledModel<S>>;

export interface PoolOptions {
  /** Memory all loaded models may hold together; Infinity for no limit. */
  readonly memoryBudget: number;
  /** Models loaded at once at most (default no limit). */
  readonly maxLoaded?: number;
  /** How long an idle model stays loaded when a request names no keep_alive (ms). */
  readonly keepAliveMs: number;
  /**
   * The longest keep_alive a request may ask (ms; Infinity lets keep_alive -1 keep a model
   * forever). A longer one is lowered to it. Default: no cap.
   */
  readonly maxKeepAliveMs?: number;
  /** Reports loads, unloads and failures (the server's log). */
  readonly log?: (line: string) => void;
  readonly now?: () => number;
}

interface Entry<S> {
  readonly name: string;
  /** How long it stays loaded when no request named a keep_alive (per model, or the server's). */
  readonly defaultKeepAliveMs: number;
  /** Memory guessed before a load: the file's size, or what the last load held. */
  estimate: number;
  phase: ModelPhase;
  loading?: Promise<PooledModel<S>>;
  model?: PooledModel<S>;
  /** Memory a load in progress has claimed. */
  reserved: number;
  /** What the last unload left (the parsed file), while unloaded. */
  residue?: Residue;
  leases: number;
  lastUsed: number;
  /** Each tenant's keep-alive (ms) and its last release: kept until the latest sum. */
  keeps: Map<string, { ms: number; since: number }>;
  /** While idle: when (pool clock) the keep-alive unloads it; Infinity for never. */
  expiresAt?: number;
  timer?: ReturnType<typeof setTimeout>;
  loads: number;
  loadFailures: number;
  loadSeconds: number;
  evictions: number;
  progress?: { bytes: number; total?: number };
  lastError?: string;
}

/** How often an expired model still busy with WebSocket work is looked at again. */
const BUSY_RECHECK_MS = 1000;
/** The longest delay setTimeout takes as given (2^31 - 1 ms). */
const MAX_TIMER_MS = 2 ** 31 - 1;

export class ModelPool<S> {
  readonly #entries = new Map<string, Entry<S>>();
  readonly #loader: Loader<S>;
  readonly #opts: PoolOptions;
  readonly #now: () => number;
  readonly #log: (line: string) => void;
  #closed = false;

  constructor(
    models: readonly {
      readonly name: string;
      readonly estimateBytes: number;
      /** This model's keep-alive when a request names none (default: opts.keepAliveMs). */
      readonly keepAliveMs?: number;
    }[],
    loader: Loader<S>,
    opts: PoolOptions,
  ) {
    for (const m of models) {
      this.#entries.set(m.name, {
        name: m.name,
        defaultKeepAliveMs: m.keepAliveMs ?? opts.keepAliveMs,
        estimate: m.estimateBytes,
        phase: "unloaded",
        reserved: 0,
        leases: 0,
        lastUsed: 0,
        keeps: new Map(),
        loads: 0,
        loadFailures: 0,
        loadSeconds: 0,
        evictions: 0,
      });
    }
    this.#loader = loader;
    this.#opts = opts;
    this.#now = opts.now ?? (() => performance.now());
    this.#log = opts.log ?? (() => {});
  }

  get names(): string[] {
    return [...this.#entries.keys()];
  }

  phaseOf(name: string): ModelPhase | undefined {
    return this.#entries.get(name)?.phase;
  }

  has(name: string): boolean {
    return this.#entries.has(name);
  }

  /** The keep-alive a request asking `ms` gets: at most --max-keep-alive. */
  keepAliveFor(ms: number): number {
    return Math.min(ms, this.#opts.maxKeepAliveMs ?? Infinity);
  }

  /**
   * The model loaded (loading it first if needed) and held: it is not unloaded before
   * release(). `keepAliveMs` (a request's keep_alive, capped by maxKeepAliveMs) replaces how
   * long `tenant` wants it kept after its last use; a tenant that never named one gets the
   * default. Rejects with ModelLoadError when the load fails.
   */
  async acquire(name: string, keepAliveMs?: number, tenant = ""): Promise<Lease<S>> {
    const e = this.#entry(name);
    if (this.#closed) throw new ModelLoadError(name, "The server is shutting down");
    e.leases++;
    clearTimeout(e.timer);
    e.timer = undefined;
    e.expiresAt = undefined;
    const keep = e.keeps.get(tenant);
    const ms = keepAliveMs === undefined
      ? keep?.ms ?? e.defaultKeepAliveMs
      : this.keepAliveFor(keepAliveMs);
    e.keeps.set(tenant, { ms, since: this.#now() });
    const waited = e.phase !== "loaded";
    let model: PooledModel<S>;
    try {
      model = e.phase === "loaded" ? e.model! : await (e.loading ?? this.#startLoad(e));
    } catch (err) {
      e.leases--;
      throw err;
    }
    e.lastUsed = this.#now();
    let released = false;
    return {
      model,
      loaded: waited,
      release: () => {
        if (released) return;
        released = true;
        e.leases--;
        e.lastUsed = this.#now();
        const keep = e.keeps.get(tenant);
        if (keep !== undefined) keep.since = e.lastUsed;
        if (e.leases === 0) this.#whenIdle(e);
      },
    };
  }

  status(): ModelStatus[] {
    return [...this.#entries.values()].map((e) => ({
      name: e.name,
      phase: e.phase,
      bytes: e.phase === "loaded" ? e.model!.bytes : e.reserved,
      residueBytes: e.residue?.bytes ?? 0,
      leases: e.leases,
      inFlight: Math.max(e.leases, e.model?.busy() ?? 0),
      keepAliveMs: this.#keepAliveMs(e),
      ...(e.phase === "loaded" && e.expiresAt !== undefined
        ? { expiresInMs: Math.max(0, e.expiresAt - this.#now()) }
        : {}),
      loads: e.loads,
      loadFailures: e.loadFailures,
      loadSeconds: e.loadSeconds,
      evictions: e.evictions,
      ...(e.phase === "loading" && e.progress ? { progress: { ...e.progress } } : {}),
      ...(e.lastError === undefined ? {} : { lastError: e.lastError }),
    }));
  }

  /** The loaded models' services (for draining and counting open work). */
  loaded(): { name: string; service: S }[] {
    return [...this.#entries.values()].filter((e) => e.phase === "loaded").map((e) => ({
      name: e.name,
      service: e.model!.service,
    }));
  }

  /** Unloads every model (after the services drained); later acquires fail. */
  async close(): Promise<void> {
    this.#closed = true;
    const loading = [...this.#entries.values()].map((e) => e.loading?.catch(() => {}));
    await Promise.all(loading);
    await Promise.all(
      [...this.#entries.values()].filter((e) => e.phase === "loaded").map((e) =>
        this.#unload(e, "shutdown")
      ),
    );
    for (const e of this.#entries.values()) if (e.residue) this.#dropResidue(e);
  }

  #entry(name: string): Entry<S> {
    const e = this.#entries.get(name);
    if (e === undefined) {
      throw new ModelLoadError(name, `Unknown model "${name}"; served: ${this.names.join(", ")}`);
    }
    return e;
  }

  #startLoad(e: Entry<S>): Promise<PooledModel<S>> {
    const started = this.#now();
    e.phase = "loading";
    e.progress = { bytes: 0 };
    e.reserved = 0;
    // The loader takes its residue over (and reuses it): from here it is counted in the load's
    // reservation, and no other load may drop it.
    e.residue = undefined;
    const load = (async () => {
      this.#reserve(e, e.estimate);
      return await this.#loader(e.name, {
        progress: (bytes, total) => {
          e.progress = { bytes, ...(total === undefined ? {} : { total }) };
        },
        reserve: (bytes) => this.#reserve(e, bytes),
      });
    })();
    e.loading = load.then(
      (model) => {
        e.phase = "loaded";
        e.model = model;
        e.reserved = 0;
        e.estimate = model.bytes;
        e.loading = undefined;
        e.progress = undefined;
        e.lastError = undefined;
        e.loads++;
        const seconds = (this.#now() - started) / 1000;
        e.loadSeconds += seconds;
        this.#log(
          `model ${e.name} loaded in ${seconds.toFixed(2)} s (${e.leases} waiting${
            model.note === undefined ? "" : `; ${model.note}`
          })`,
        );
        // Closed while it loaded: nobody will release it through the pool.
        if (this.#closed) void this.#unload(e, "shutdown");
        return model;
      },
      (err) => {
        e.phase = "unloaded";
        e.reserved = 0;
        e.loading = undefined;
        e.progress = undefined;
        // The keep-alives asked of a load that never happened: the next one starts afresh.
        e.keeps.clear();
        e.loadFailures++;
        const failure = err instanceof ModelLoadError ? err : new ModelLoadError(
          e.name,
          `Cannot load model "${e.name}": ${err instanceof Error ? err.message : String(err)}`,
        );
        e.lastError = failure.message;
        this.#log(`model ${e.name} failed to load: ${failure.message}`);
        throw failure;
      },
    );
    return e.loading;
  }

  /** Claims `bytes` for a load, unloading least recently used idle models until they fit. */
  #reserve(e: Entry<S>, bytes: number): void {
    const budget = this.#opts.memoryBudget;
    if (bytes > budget) {
      throw new ModelLoadError(
        e.name,
        `Cannot load model "${e.name}": it needs ${mib(bytes)}, more than the whole memory ` +
          `budget of ${mib(budget)} (--memory-budget)`,
        true,
      );
    }
    const maxLoaded = this.#opts.maxLoaded ?? Infinity;
    const others = () => [...this.#entries.values()].filter((o) => o !== e);
    const used = () =>
      others().reduce(
        (s, o) =>
          s + (o.residue?.bytes ?? 0) +
          (o.phase === "loaded" ? o.model!.bytes : o.phase === "loading" ? o.reserved : 0),
        0,
      );
    const count = () => others().filter((o) => o.phase !== "unloaded").length;
    // Parsed files of unloaded models go first, least recently used first: dropping one costs
    // only its next load's read.
    while (used() + bytes > budget) {
      const residue = others().filter((o) => o.residue !== undefined)
        .sort((a, b) => a.lastUsed - b.lastUsed)[0];
      if (residue === undefined) break;
      this.#dropResidue(residue);
    }
    while (used() + bytes > budget || count() + 1 > maxLoaded) {
      const victim = others()
        .filter((o) => o.phase === "loaded" && this.#idle(o) && this.#keepAliveMs(o) !== Infinity)
        .sort((a, b) => a.lastUsed - b.lastUsed)[0];
      if (victim === undefined) {
        const why = used() + bytes > budget
          ? `it needs ${mib(bytes)} and ${mib(used())} of the ${mib(budget)} budget ` +
            `(--memory-budget) is held`
          : `${count()} models are loaded, the most --max-loaded-models allows`;
        throw this.#noRoom(e, why, others().filter((o) => o.phase !== "unloaded"));
      }
      void this.#unload(victim, "evicted");
    }
    e.reserved = bytes;
  }

  /**
   * The refusal of a load for want of room, naming what holds it: each model, its size, its
   * state and how long it is kept. Only requests running or a load can end soon; where the
   * holders are all kept forever, waiting will not help, and the error says so (no retry).
   */
  #noRoom(e: Entry<S>, why: string, holders: Entry<S>[]): ModelLoadError {
    const held = holders.map((o) => {
      const size = mib(o.phase === "loaded" ? o.model!.bytes : o.reserved);
      const inFlight = Math.max(o.leases, o.model?.busy() ?? 0);
      const state = o.phase === "loading"
        ? "loading"
        : inFlight > 0
        ? `busy: ${inFlight} request${inFlight === 1 ? "" : "s"} running`
        : "idle";
      const keep = this.#keepAliveMs(o);
      return `${o.name} ${size} (${state}; kept ${
        keep === Infinity
          ? "forever (keep_alive -1)"
          : `${formatKeepAlive(keep)} after its last request`
      })`;
    });
    const waitable = holders.some((o) => o.phase === "loading" || !this.#idle(o));
    return new ModelLoadError(
      e.name,
      `Cannot load model "${e.name}": ${why}, by models that cannot be unloaded now: ${
        held.join(", ")
      }; ${
        waitable
          ? "retry when the busy ones are idle"
          : "waiting will not help: they stay until every key keeping them forever sends " +
            "keep_alive 0 for them, or the server restarts (--max-keep-alive caps keep_alive)"
      }`,
      true,
      waitable ? 1 : null,
    );
  }

  /** The longest keep-alive any tenant wants for the model. */
  #keepAliveMs(e: Entry<S>): number {
    let ms = e.keeps.size === 0 ? e.defaultKeepAliveMs : 0;
    for (const k of e.keeps.values()) ms = Math.max(ms, k.ms);
    return ms;
  }

  #dropResidue(e: Entry<S>): void {
    const r = e.residue!;
    e.residue = undefined;
    this.#log(`model ${e.name}: parsed file dropped (${mib(r.bytes)} freed)`);
    r.drop();
  }

  #idle(e: Entry<S>): boolean {
    return e.leases === 0 && (e.model?.busy() ?? 0) === 0;
  }

  /** Starts the keep-alive of a model gone idle: unloaded once every tenant's has passed. */
  #whenIdle(e: Entry<S>): void {
    if (e.phase !== "loaded" || this.#closed) return;
    clearTimeout(e.timer);
    e.timer = undefined;
    const now = this.#now();
    let deadline = -Infinity;
    for (const k of e.keeps.values()) deadline = Math.max(deadline, k.since + k.ms);
    if (e.keeps.size === 0) deadline = now + e.defaultKeepAliveMs;
    e.expiresAt = deadline;
    if (deadline === Infinity) return;
    const expire = () => {
      e.timer = undefined;
      if (e.phase !== "loaded" || e.leases > 0) return;
      if (!this.#idle(e)) {
        e.timer = setTimeout(expire, BUSY_RECHECK_MS);
        return;
      }
      void this.#unload(e, "expired");
    };
    // setTimeout fires at once for a delay past 2^31 - 1 ms (24.8 days): wait in steps.
    const wait = (ms: number) => {
      if (ms <= 0) return expire();
      const step = Math.min(ms, MAX_TIMER_MS);
      e.timer = setTimeout(() => ms > step ? wait(ms - step) : expire(), step);
    };
    wait(deadline - now);
  }

  /** Takes a model out of the pool at once (its memory counts as free) and closes it. */
  async #unload(e: Entry<S>, why: "evicted" | "expired" | "shutdown"): Promise<void> {
    const model = e.model!;
    clearTimeout(e.timer);
    e.timer = undefined;
    e.phase = "unloaded";
    e.model = undefined;
    e.expiresAt = undefined;
    // The next load starts from the default keep-alive again, unless its request names one.
    e.keeps.clear();
    if (why === "evicted") e.evictions++;
    this.#log(`model ${e.name} unloaded (${why}, ${mib(model.bytes)} freed)`);
    let residue: Residue | void = undefined;
    try {
      residue = await model.close();
    } catch (err) {
      this.#log(`model ${e.name}: closing failed: ${err instanceof Error ? err.message : err}`);
    }
    // A load begun meanwhile already reuses it.
    if (!residue || e.phase !== "unloaded") return;
    // An evicted model's memory was wanted, its parsed file's too. One that expired keeps it
    // until room is needed.
    if (why !== "expired" || this.#closed) residue.drop();
    else e.residue = residue;
  }
}

function mib(bytes: number): string {
  return bytes === Infinity ? "unlimited" : `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}
