import { CLUSTER_DEFAULTS } from "./cluster_defaults.ts";
import { type Heartbeat, type ReplicaModel, servedModels } from "./messages.ts";
import { type Candidate, matchedBlocks } from "./routing.ts";

/** What a router knows about one replica. */
export interface ReplicaView {
  readonly id: string;
  heartbeat: Heartbeat;
  /** performance.now() of its last heartbeat. */
  lastSeen: number;
  /** Streams this router has open there now. */
  open: number;
  /** Requests this router has sent there. */
  routed: number;
  /** Decaying count of requests sent there (half-life RECENT_HALF_LIFE_MS), as of recentAt. */
  recent: number;
  recentAt: number;
  /** Its reported prefix cache, plus what this router sent it since (not yet reported). */
  cached: Set<number>;
  /** Hashes of prompts routed there, with when, kept until a heartbeat reports them. */
  pending: Map<number, number>;
  /** The router's model as this replica lists it (a replica of several models may not have it loaded). */
  entry: ReplicaModel;
  /**
   * When this router last sent it work for the model (or asked it for the model's info): it is
   * loading it then, though its beats may not say so yet. Cleared once a beat says loaded.
   */
  warmingAt?: number;
}

const RECENT_HALF_LIFE_MS = CLUSTER_DEFAULTS.recentHalfLifeMs;
const PENDING_MS = CLUSTER_DEFAULTS.pendingMs;

function decayed(v: ReplicaView, now: number): number {
  return v.recent * Math.pow(0.5, (now - v.recentAt) / RECENT_HALF_LIFE_MS);
}

export interface RegistryOptions {
  /** A replica silent this long leaves the rotation (default 1500 ms). */
  readonly staleAfterMs?: number;
  /** ...and one whose load figures are this old (its main thread hangs; default 15 s). */
  readonly stalledAfterMs?: number;
  readonly now?: () => number;
  /** Replicas serving another model are never used; the first one seen decides (or this). */
  readonly model?: string;
  /** ...and, when replicas report it, the model's identity (HeartbeatSchema.modelId). */
  readonly modelId?: string;
  readonly log?: (line: string) => void;
}

/**
 * The replicas a router has heard from, fed by heartbeats. A replica is in the rotation while
 * its heartbeats keep coming (within staleAfterMs), it is not draining, and it serves the
 * router's model. Its prefix summary is the last heartbeat's hashes together with the hashes
 * of prompts this router sent it since, so that requests arriving between two beats still find
 * the prefix where the first of them went (SGLang's router keeps such an approximate tree).
 */
export class ReplicaRegistry {
  readonly #views = new Map<string, ReplicaView>();
  readonly #staleAfterMs: number;
  readonly #stalledAfterMs: number;
  readonly #now: () => number;
  readonly #log: (line: string) => void;
  #model: string | undefined;
  #modelId: string | undefined;
  readonly #foreign = new Set<string>();

  constructor(opts: RegistryOptions = {}) {
    this.#staleAfterMs = opts.staleAfterMs ?? CLUSTER_DEFAULTS.staleAfterMs;
    this.#stalledAfterMs = opts.stalledAfterMs ?? CLUSTER_DEFAULTS.stalledAfterMs;
    this.#now = opts.now ?? (() => performance.now());
    this.#model = opts.model;
    this.#modelId = opts.modelId;
    this.#log = opts.log ?? (() => {});
  }

  get model(): string | undefined {
    return this.#model;
  }

  set model(name: string | undefined) {
    this.#model = name;
    this.#dropForeign();
  }

  get modelId(): string | undefined {
    return this.#modelId;
  }

  set modelId(id: string | undefined) {
    this.#modelId = id;
    this.#dropForeign();
  }

  /** Views recorded before the model was known that turn out to serve another one. */
  #dropForeign(): void {
    for (const [id, v] of this.#views) if (!this.#serves(v.heartbeat)) this.#views.delete(id);
  }

  #serves(hb: Heartbeat): boolean {
    return this.#entryOf(hb) !== undefined;
  }

  /** The router's model in the heartbeat's list (by name and, once known, identity). */
  #entryOf(hb: Heartbeat): ReplicaModel | undefined {
    const name = this.#model ?? hb.model;
    return servedModels(hb).find((m) =>
      m.name === name && (this.#modelId === undefined || m.modelId === this.#modelId)
    );
  }

  get(id: string): ReplicaView | undefined {
    return this.#views.get(id);
  }

  /** Records a heartbeat; returns the view (new or updated), or undefined for a foreign model. */
  onHeartbeat(hb: Heartbeat): ReplicaView | undefined {
    const entry = this.#entryOf(hb);
    if (entry === undefined) {
      if (!this.#foreign.has(hb.replica)) {
        this.#foreign.add(hb.replica);
        this.#log(
          `replica ${hb.replica} serves model ${JSON.stringify(hb.model)} (${
            hb.modelId ?? "no id"
          }), not ${JSON.stringify(this.#model)} (${this.#modelId ?? "no id"}): it gets no ` +
            "traffic from this router",
        );
      }
      return undefined;
    }
    const now = this.#now();
    let v = this.#views.get(hb.replica);
    if (v === undefined) {
      v = {
        id: hb.replica,
        heartbeat: hb,
        lastSeen: now,
        open: 0,
        routed: 0,
        recent: 0,
        recentAt: now,
        cached: new Set(),
        pending: new Map(),
        entry,
      };
      this.#views.set(hb.replica, v);
    }
    // A routed prompt's blocks are cached there only once its prefill ran, which can take
    // seconds on a busy replica: they stay assumed until a beat reports them, or for
    // PENDING_MS (the request failed, or the blocks were evicted before a beat saw them).
    v.heartbeat = hb;
    v.lastSeen = now;
    v.entry = entry;
    if (entry.phase === "loaded") v.warmingAt = undefined;
    v.cached = new Set(entry.hashes ?? []);
    for (const [h, at] of v.pending) {
      if (v.cached.has(h) || now - at > PENDING_MS) v.pending.delete(h);
      else v.cached.add(h);
    }
    return v;
  }

  onGoodbye(id: string): void {
    this.#views.delete(id);
  }

  /** A request was sent there: count it and remember its prompt's blocks as cached there. */
  noteRouted(id: string, promptHashes: readonly number[]): void {
    const v = this.#views.get(id);
    if (v === undefined) return;
    v.routed++;
    const now = this.#now();
    if (v.entry.phase !== "loaded") v.warmingAt = now;
    v.recent = decayed(v, now) + 1;
    v.recentAt = now;
    for (const h of promptHashes) {
      v.pending.set(h, now);
      v.cached.add(h);
    }
  }

  /** It was asked for the model's info, which a replica of several models loads it to give. */
  noteWarming(id: string): void {
    const v = this.#views.get(id);
    if (v !== undefined && v.entry.phase !== "loaded") v.warmingAt = this.#now();
  }

  /** The model is loaded there, loading, or about to be (this router sent it work for it). */
  hasLoaded(v: ReplicaView): boolean {
    return v.entry.phase !== "unloaded" ||
      (v.warmingAt !== undefined && this.#now() - v.warmingAt <= PENDING_MS);
  }

  isLive(v: ReplicaView): boolean {
    return this.#now() - v.lastSeen <= this.#staleAfterMs &&
      v.heartbeat.stalledMs <= this.#stalledAfterMs;
  }

  /**
   * This router's own event loop did not run for `ms` (a contended machine): heartbeats that
   * arrived meanwhile are still unread, so that time does not count as the replicas' silence.
   */
  forgive(ms: number): void {
    for (const v of this.#views.values()) v.lastSeen += ms;
  }

  /** Forgets replicas silent for a long time (ten times the staleness bound). */
  prune(): void {
    const now = this.#now();
    for (const [id, v] of this.#views) {
      if (now - v.lastSeen > 10 * this.#staleAfterMs) this.#views.delete(id);
    }
  }

  /** Live, non-draining replicas. */
  inRotation(): ReplicaView[] {
    return [...this.#views.values()].filter((v) => this.isLive(v) && !v.heartbeat.draining);
  }

  all(): ReplicaView[] {
    return [...this.#views.values()];
  }

  /**
   * Why a router over these replicas should get no traffic now (its /ready): none in rotation,
   * or every one at its limit, when each new request would be refused as overloaded.
   */
  readinessProblems(): string[] {
    const open = this.candidates(() => [], new Set());
    if (open.length === 0) return ["no replica in rotation"];
    if (open.every((c) => c.load >= c.capacity)) {
      const load = open.reduce((n, c) => n + c.load, 0),
        cap = open.reduce((n, c) => n + c.capacity, 0);
      return [`every replica is full (${load} requests running or waiting, capacity ${cap})`];
    }
    return [];
  }

  /** Routing candidates for a prompt with these block hashes (replicas in `exclude` left out). */
  candidates(
    promptHashesFor: (blockSize: number) => readonly number[],
    exclude: ReadonlySet<string>,
  ): Candidate[] {
    return this.inRotation().filter((v) => !exclude.has(v.id)).map((v) => {
      const l = v.heartbeat.load;
      const loaded = this.hasLoaded(v);
      // A model loaded there has its own scheduler's load; one not loaded yet would get a new
      // scheduler on a replica busy with its other models, whose total load then counts.
      const own = v.entry.phase === "loaded" && v.heartbeat.models !== undefined
        ? (v.entry.running ?? 0) + (v.entry.waiting ?? 0)
        : l.running + l.waiting;
      return {
        id: v.id,
        // Its report is up to a beat old; this router's own count of open streams is exact.
        load: Math.max(v.open, own),
        capacity: l.maxRunning + l.maxWaiting + (v.entry.phase === "loaded" ? 0 : own),
        loaded,
        routed: v.routed,
        recent: decayed(v, this.#now()),
        matchedBlocks: matchedBlocks(promptHashesFor(v.heartbeat.prefix.blockSize), v.cached),
        cachedBlocks: v.cached.size,
      };
    });
  }
}
