/**
 * A router by model (`deno task router --by-model`): replicas may serve different models, and
 * each request goes to one serving the model it names. The models are learnt from the
 * replicas' heartbeats; each gets a RouterBackend of its own (routing among that model's
 * replicas by the router's policy, prefix-aware by default) and an app over it, and the front
 * of lib/http/models_front.ts picks the app by the request's `model`.
 */
import { CLUSTER_DEFAULTS } from "./cluster_defaults.ts";
import { createApp, type ServiceApp } from "../http/app.ts";
import { ServiceMetrics } from "../http/service_metrics.ts";
import {
  type CatalogModel,
  type Lease,
  type ModelDirectory,
  ModelLoadError,
  type ModelPhase,
  type ModelStatus,
} from "../http/model_directory.ts";
import { decodeMessage, ReplicaAnnouncement, type ReplicaModel, servedModels } from "./messages.ts";
import { type BusConnection, type BusSubscription, cappedLog, guarded } from "./nats_connection.ts";
import { RouterBackend } from "./router_backend.ts";
import type { RoutingPolicy } from "./routing.ts";
import { subjects } from "./subjects.ts";

export interface ModelRouterOptions {
  readonly policy?: RoutingPolicy;
  readonly apiKeys?: readonly string[];
  readonly cacheScope?: "key" | "global";
  readonly drainTimeoutMs?: number;
  /** A model none of whose replicas beat for this long is no longer served (default 5 s). */
  readonly forgetAfterMs?: number;
  readonly log?: (line: string) => void;
  /** Where what peers cause is logged (default: `log`, capped). */
  readonly peerLog?: (line: string) => void;
  /**
   * Models this directory leaves to another router (a plain router's own model, served by its
   * first RouterBackend): never built here, never listed, though their aliases are learnt.
   */
  readonly servedElsewhere?: (name: string) => boolean;
}

interface Routed {
  /** The last heartbeat naming it, by replica: when, the model's phase and its aliases there. */
  readonly replicas: Map<
    string,
    { at: number; phase: ReplicaModel["phase"]; aliases: readonly string[] }
  >;
  /**
   * Its name, then every alias a replica lately heard gives it: the names its app accepts (read
   * at each request), kept in step with the heartbeats.
   */
  readonly served: string[];
  building?: Promise<{ backend: RouterBackend; service: ServiceApp }>;
  built?: { backend: RouterBackend; service: ServiceApp };
}

export class ModelRouterDirectory implements ModelDirectory {
  /** Each model's metrics registry (the front labels them by model). */
  readonly modelMetrics = new Map<string, ServiceMetrics>();
  readonly #models = new Map<string, Routed>();
  readonly #nc: BusConnection;
  readonly #opts: ModelRouterOptions;
  readonly #sub: BusSubscription;
  readonly #log: (line: string) => void;
  readonly #peerLog: (line: string) => void;

  constructor(nc: BusConnection, opts: ModelRouterOptions = {}) {
    this.#nc = nc;
    this.#opts = opts;
    this.#log = opts.log ?? (() => {});
    const peerLog = this.#peerLog = opts.peerLog ?? cappedLog(this.#log);
    this.#sub = nc.subscribe(subjects.announce, {
      callback: guarded((msg) => {
        const a = decodeMessage(ReplicaAnnouncement, msg.data);
        if (!a.ok) return peerLog(`router: ignored a malformed announcement: ${a.error}`);
        if (a.value.type === "goodbye") {
          for (const m of this.#models.values()) m.replicas.delete(a.value.replica);
          return;
        }
        if (a.value.draining) return;
        for (const served of servedModels(a.value)) {
          let m = this.#models.get(served.name);
          if (m === undefined) {
            this.#models.set(served.name, m = { replicas: new Map(), served: [served.name] });
            this.#log(
              `router: replica ${a.value.replica} serves model ${JSON.stringify(served.name)}`,
            );
          }
          const aliases = served.aliases ?? [];
          m.replicas.set(a.value.replica, { at: performance.now(), phase: served.phase, aliases });
          for (const alias of aliases) {
            if (m.served.includes(alias)) continue;
            m.served.push(alias);
            const [model, as] = [served.name, alias].map((n) => JSON.stringify(n));
            this.#log(`router: model ${model} is also served as ${as}`);
          }
          // Built as soon as a replica has it loaded, so that its first request does not wait
          // for the info. A model loaded nowhere is built by its first request: asking a
          // replica for its info loads it there.
          if (served.phase === "loaded" && !this.#elsewhere(served.name)) {
            void this.#build(served.name).catch(() => {});
          }
        }
      }, (e) => peerLog(`router: handling an announcement failed: ${(e as Error).message}`)),
    });
  }

  /** Models with a replica heard from lately, in the order they were first seen. */
  get names(): string[] {
    return this.#heard().filter((name) => !this.#elsewhere(name));
  }

  /** Every model heard from lately, those served elsewhere included. */
  #heard(): string[] {
    return [...this.#models].filter(([, m]) => this.#lately(m).length > 0)
      .map(([name]) => name);
  }

  /** What the replicas heard from lately (within forgetAfterMs) said of a model. */
  #lately(m: Routed) {
    const now = performance.now();
    const forget = this.#opts.forgetAfterMs ?? CLUSTER_DEFAULTS.forgetModelAfterMs;
    return [...m.replicas.values()].filter((r) => now - r.at < forget);
  }

  #elsewhere(name: string): boolean {
    return this.#opts.servedElsewhere?.(name) ?? false;
  }

  /**
   * The aliases replicas heard from lately give a model (`--served-model-name alias=model`), in
   * the order first heard; a replica that stops beating takes its aliases with it.
   */
  aliasesOf(name: string): string[] {
    const m = this.#models.get(name);
    if (m === undefined) return [];
    const live = new Set(this.#lately(m).flatMap((r) => r.aliases));
    return m.served.slice(1).filter((a) => live.has(a) && a !== name);
  }

  /**
   * The model a request's name stands for: a model's own name, else the model one of whose
   * aliases it is (a model's own name wins over another's alias); undefined when none is heard.
   * Models served elsewhere are resolved too, so that their aliases reach them.
   */
  resolve(asked: string): string | undefined {
    const heard = this.#heard();
    if (heard.includes(asked)) return asked;
    return heard.find((name) => this.aliasesOf(name).includes(asked));
  }

  catalog(): CatalogModel[] {
    return this.names.map((name) => {
      const b = this.#models.get(name)?.built?.backend;
      const aliases = this.aliasesOf(name);
      return {
        name,
        ...(aliases.length === 0 ? {} : { aliases }),
        ...(b === undefined ? {} : { contextLength: b.contextLength }),
      };
    });
  }

  has(name: string): boolean {
    return this.names.includes(name);
  }

  /**
   * "loaded" once the router routes it and a replica has it loaded; "loading" while its router
   * starts or a replica loads it; else "unloaded" (replicas serve it, none has it loaded).
   */
  phaseOf(name: string): ModelPhase | undefined {
    const m = this.#models.get(name);
    if (m === undefined) return undefined;
    const phases = this.#lately(m).map((r) => r.phase);
    if (m.built && phases.includes("loaded")) return "loaded";
    if ((m.building && !m.built) || phases.includes("loading") || phases.includes("loaded")) {
      return "loading";
    }
    return "unloaded";
  }

  async acquire(name: string): Promise<Lease<ServiceApp>> {
    let built;
    try {
      built = await this.#build(name);
    } catch (e) {
      throw new ModelLoadError(
        name,
        `Cannot route to model "${name}": ${(e as Error).message}`,
        true,
      );
    }
    return {
      model: {
        service: built.service,
        bytes: 0,
        busy: () => built.service.inFlight,
        close: () => Promise.resolve(),
      },
      loaded: false,
      release() {},
    };
  }

  /** The replicas load and unload: the pool's families are theirs to export (/metrics). */
  readonly countsLoads = false;

  status(): ModelStatus[] {
    return this.names.map((name) => ({
      name,
      phase: this.phaseOf(name)!,
      bytes: 0,
      residueBytes: 0,
      leases: 0,
      inFlight: this.#models.get(name)?.built?.service.inFlight ?? 0,
      keepAliveMs: Infinity,
      loads: 0,
      loadFailures: 0,
      loadSeconds: 0,
      evictions: 0,
    }));
  }

  loaded(): { name: string; service: ServiceApp }[] {
    return [...this.#models].flatMap(([name, m]) =>
      m.built ? [{ name, service: m.built.service }] : []
    );
  }

  close(): Promise<void> {
    this.#sub.unsubscribe();
    for (const m of this.#models.values()) m.built?.backend.close();
    return Promise.resolve();
  }

  /** The model's router backend and app, started once (again after a failed start). */
  #build(name: string): Promise<{ backend: RouterBackend; service: ServiceApp }> {
    const m = this.#models.get(name);
    if (m === undefined) return Promise.reject(new Error("no replica serves it"));
    if (m.built) return Promise.resolve(m.built);
    m.building ??= (async () => {
      let metrics = this.modelMetrics.get(name);
      if (metrics === undefined) this.modelMetrics.set(name, metrics = new ServiceMetrics());
      const backend = await RouterBackend.start(this.#nc, {
        model: name,
        // A replica of several models loads the model to answer the info request.
        waitMs: CLUSTER_DEFAULTS.modelLoadWaitMs,
        infoTimeoutMs: CLUSTER_DEFAULTS.modelLoadWaitMs,
        metrics,
        log: this.#log,
        peerLog: this.#peerLog,
        ...(this.#opts.policy === undefined ? {} : { policy: this.#opts.policy }),
      });
      const service = createApp({
        backend,
        metrics,
        // The live list: aliases heard after the build are accepted too.
        servedModelNames: m.served,
        ...(this.#opts.apiKeys === undefined ? {} : { apiKeys: this.#opts.apiKeys }),
        ...(this.#opts.cacheScope === undefined ? {} : { cacheScope: this.#opts.cacheScope }),
        ...(this.#opts.drainTimeoutMs === undefined
          ? {}
          : { drainTimeoutMs: this.#opts.drainTimeoutMs }),
      });
      m.built = { backend, service };
      this.#log(`router: routing model ${JSON.stringify(name)} (context ${backend.contextLength})`);
      return m.built;
    })();
    m.building.catch(() => m.building = undefined);
    return m.building;
  }
}
