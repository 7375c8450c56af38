/**
 * The contract between the front of several models (models_front.ts) and what holds the
 * models: the pool of a server, which loads them (lib/compose/model_pool.ts), or a router's
 * directory of the models replicas advertise (lib/cluster/model_router.ts). Both sit above
 * lib/http and hand the front their models through it.
 */
import type { ServiceApp } from "./app.ts";

/** A loaded model as the pool sees it: what to forward to, what it holds, how to free it. */
export interface PooledModel<S> {
  readonly service: S;
  /** Memory it holds (weights and KV cache), counted against the budget. */
  readonly bytes: number;
  /** Said after "loaded in N s" in the log, e.g. that it reused its parsed file. */
  readonly note?: string;
  /** Work open on it that the pool's leases do not see (WebSocket generations). */
  busy(): number;
  /**
   * Frees the model; what it leaves for a faster next load (its parsed file) comes back as a
   * residue, which the pool counts against the budget and drops first when it needs room.
   */
  close(): Promise<Residue | void>;
}

/** What an unloaded model leaves behind to load faster next time (its parsed file). */
export interface Residue {
  readonly bytes: number;
  /** Frees it; the next load starts from the file again. */
  drop(): void;
}

export type ModelPhase = "unloaded" | "loading" | "loaded";

/** A load that failed; every request that waited for it gets this. */
export class ModelLoadError extends Error {
  constructor(
    readonly model: string,
    message: string,
    readonly insufficientMemory = false,
    /**
     * With insufficientMemory: seconds after which a retry may find room, or null when waiting
     * will not help (the memory is held by models kept forever).
     */
    readonly retryAfterSeconds: number | null = 1,
  ) {
    super(message);
    this.name = "ModelLoadError";
  }
}

/** What acquire() gives: the loaded model, held until release(). */
export interface Lease<S> {
  readonly model: PooledModel<S>;
  /** True when this request waited for the model to load. */
  readonly loaded: boolean;
  release(): void;
}

/** One model's state and counters, for /health, /v1/models and /metrics. */
export interface ModelStatus {
  readonly name: string;
  readonly phase: ModelPhase;
  readonly bytes: number;
  /** Memory an unloaded model's parsed file still holds (reused by its next load). */
  readonly residueBytes: number;
  readonly leases: number;
  /** Requests it is answering or loading for, and WebSocket generations on it. */
  readonly inFlight: number;
  /** The longest keep-alive a tenant asked for (the default's before any request). */
  readonly keepAliveMs: number;
  /**
   * While loaded and idle: ms from now until the keep-alive unloads it (Infinity: kept
   * forever). Absent while it is busy, loading or unloaded.
   */
  readonly expiresInMs?: number;
  readonly loads: number;
  readonly loadFailures: number;
  readonly loadSeconds: number;
  readonly evictions: number;
  readonly progress?: { readonly bytes: number; readonly total?: number };
  readonly lastError?: string;
}

/** What /v1/models says of a model, loaded or not. */
export interface CatalogModel {
  readonly name: string;
  /** Further names a request may give for it (`--served-model-name alias=model`). */
  readonly aliases?: readonly string[];
  /**
   * What its names stand for (/v1/models' `root`) where that is none of them: a server of one
   * model whose --served-model-name replaced the file's name. Default: `name`.
   */
  readonly root?: string;
  readonly path?: string;
  readonly bytes?: number;
  readonly format?: string;
  readonly architecture?: string;
  readonly quantization?: string;
  /** The context the file declares (or --context-length). */
  readonly contextLength?: number;
  /** How its tool calls are written: `native:<format>` (its template's) or `generic`. */
  readonly toolFormat?: string;
}

/**
 * The models behind the front and how to get one's app: the pool of a server (which loads
 * them), or a router's models as replicas advertise them (lib/cluster/model_router.ts).
 */
export interface ModelDirectory {
  readonly names: readonly string[];
  has(name: string): boolean;
  phaseOf(name: string): ModelPhase | undefined;
  /**
   * The model's app, held until release(); rejects with ModelLoadError. `tenant` (the API key's
   * scope, "" without keys) is whose keep-alive `keepAliveMs` sets.
   */
  acquire(name: string, keepAliveMs?: number, tenant?: string): Promise<Lease<ServiceApp>>;
  status(): ModelStatus[];
  loaded(): { name: string; service: ServiceApp }[];
  close(): Promise<void>;
  /**
   * False for a directory that loads nothing itself (a router by model): its status has no
   * loads, evictions or resident bytes to export, and zeros would read as measurements.
   */
  readonly countsLoads?: boolean;
}
