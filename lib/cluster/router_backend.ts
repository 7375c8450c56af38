import { CLUSTER_DEFAULTS } from "./cluster_defaults.ts";
import type {
  CoreStats,
  GenerationBackend,
  GenerationEvent,
  GenerationRequest,
  Priority,
} from "../core/generation.ts";
import { type Embedder, EmbeddingError } from "../core/embedder.ts";
import { cacheScopeRoot, prefixBlockHashes } from "../core/block_allocator.ts";
import type { Counter, Gauge } from "../http/metrics.ts";
import type { ServiceMetrics } from "../http/service_metrics.ts";
import { PromptTokens } from "../backend/prompt_tokens.ts";
import { DelegatedText } from "../backend/delegated_text.ts";
import { Tokenizer } from "../tokenizer/tokenizer.ts";
import {
  decodeMessage,
  type Embed,
  encodeMessage,
  type Generate,
  type InfoReply,
  ReplicaAnnouncement,
  servedModels,
  StreamFrame,
} from "./messages.ts";
import { fromBase64, requestInfo } from "./info_parts.ts";
import { RemoteEmbedding } from "./remote_embedding.ts";
import { type BusConnection, type BusSubscription, cappedLog, guarded } from "./nats_connection.ts";
import {
  type AttemptEnd,
  Failover,
  type GenerateBody,
  NO_REPLICA,
  notTakenOver,
} from "./failover.ts";
import { RemoteStream } from "./remote_stream.ts";
import { avoidsReplica, describeLoss, LOSS_LABEL, type StreamLoss } from "./stream_loss.ts";
import { tokenizerFromWire } from "./tokenizer_wire.ts";
import { ReplicaRegistry } from "./replica_registry.ts";
import { chooseReplica, type RoutingPolicy } from "./routing.ts";
import { randomId, subjects } from "./subjects.ts";

export interface RouterOptions {
  readonly policy?: RoutingPolicy;
  /** A stream with no frame and no heartbeat listing it for this long is lost (default 1500 ms). */
  readonly streamTimeoutMs?: number;
  /** A replica silent this long leaves the rotation (default 1500 ms). */
  readonly staleAfterMs?: number;
  /** How long a stream that lost its replica waits for another one (default 30 s). */
  readonly failoverWaitMs?: number;
  /**
   * A stream with no frame for this long is lost even while its replica's heartbeats list it
   * (a hung engine step looks alive; default 30 s): it fails over to another replica.
   */
  readonly progressTimeoutMs?: number;
  /** Frames a replica may send ahead of the client (default 64). */
  readonly window?: number;
  /** Share the HTTP app's metrics to add the router's own series to /metrics. */
  readonly metrics?: ServiceMetrics;
  readonly log?: (line: string) => void;
  /** Where what peers cause is logged (default: `log`, capped). */
  readonly peerLog?: (line: string) => void;
  /** The model it routes, named in each generate (a router by model's; see start). */
  readonly model?: string;
}

interface RouterMetrics {
  readonly replicas: Gauge;
  readonly routed: Counter;
  readonly failovers: Counter;
  readonly lostStreams: Counter;
  readonly byReplica: Counter;
  readonly embeddingRetries: Counter;
}

function routerMetrics(m: ServiceMetrics): RouterMetrics {
  const r = m.registry;
  return {
    replicas: r.gauge(
      "llm_router_replicas",
      "Replicas known to the router, by state (ready, draining, stale).",
      ["state"],
    ),
    routed: r.counter(
      "llm_router_routed_total",
      "Generation attempts sent to a replica, by why that one (prefix, least_loaded, round_robin).",
      ["reason"],
    ),
    failovers: r.counter(
      "llm_router_failovers_total",
      "Generations resubmitted to another replica after losing theirs mid-stream.",
    ),
    byReplica: r.counter(
      "llm_router_replica_requests_total",
      "Generation attempts sent to each replica, by replica id.",
      ["replica"],
    ),
    embeddingRetries: r.counter(
      "llm_router_embedding_retries_total",
      "Embeddings asked again of another replica after theirs was lost or refused them.",
    ),
    lostStreams: r.counter(
      "llm_router_lost_streams_total",
      "Streams and embeddings given up, by why (silent: no frame or heartbeat; gap: frames lost; " +
        "no_progress: listed by its replica but no frame; goodbye: its replica stopped; " +
        "refused: overloaded or draining before it began).",
      ["why"],
    ),
  };
}

const UNLISTED_GRACE_MS = CLUSTER_DEFAULTS.unlistedGraceMs;

const delay = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * The router's GenerationBackend: the HTTP app (WebSocket, OpenAI routes, metrics, playground,
 * API keys) runs over it unchanged, and each generation goes to a replica over NATS.
 *
 * Failover is exact (failover.ts): a lost stream (stream_loss.ts says why) is resubmitted to
 * another replica as prompt + the tokens delivered, with the same seed.
 */
export class RouterBackend extends DelegatedText<PromptTokens> implements GenerationBackend {
  readonly id = randomId("router");
  readonly modelName: string;
  readonly contextLength: number;
  readonly vocabSize: number;
  readonly chatTemplate?: string;
  readonly rerankPrompt?: string;
  readonly bosToken: string;
  readonly eosToken: string;
  readonly registry: ReplicaRegistry;
  /** Generations resubmitted after a loss (for tests and the closing log). */
  failovers = 0;
  /** The replicas' embeddings, where the model gives them there (its info says how). */
  readonly embedder?: Embedder;
  readonly #nc: BusConnection;
  readonly specialTokens: readonly string[];
  readonly #policy: RoutingPolicy;
  /** The model a router by model routes (named in each generate, for replicas of several). */
  readonly #model: string | undefined;
  readonly #streamTimeoutMs: number;
  readonly #failoverWaitMs: number;
  readonly #progressTimeoutMs: number;
  readonly #window: number;
  readonly #metrics?: RouterMetrics;
  readonly #log: (line: string) => void;
  readonly #peerLog: (line: string) => void;
  readonly #streams = new Map<string, RemoteStream>();
  readonly #embeds = new Map<string, RemoteEmbedding>();
  #closed = false;
  readonly #subs: BusSubscription[];
  readonly #timer: ReturnType<typeof setInterval>;
  #turn = 0;
  #lastWatch = performance.now();

  private constructor(
    nc: BusConnection,
    info: InfoReply,
    registry: ReplicaRegistry,
    announcements: BusSubscription,
    opts: RouterOptions,
  ) {
    super(new PromptTokens(new Tokenizer(tokenizerFromWire(info.tokenizer))));
    this.#nc = nc;
    this.registry = registry;
    this.modelName = info.modelName;
    this.contextLength = info.contextLength;
    this.vocabSize = info.vocabSize;
    this.chatTemplate = info.chatTemplate;
    this.rerankPrompt = info.rerankPrompt;
    this.bosToken = info.bosToken;
    this.eosToken = info.eosToken;
    this.specialTokens = this.text.specialTokens;
    this.#policy = opts.policy ?? CLUSTER_DEFAULTS.routing;
    this.#model = opts.model;
    this.#streamTimeoutMs = opts.streamTimeoutMs ?? CLUSTER_DEFAULTS.streamTimeoutMs;
    this.#failoverWaitMs = opts.failoverWaitMs ?? CLUSTER_DEFAULTS.failoverWaitMs;
    this.#progressTimeoutMs = opts.progressTimeoutMs ?? CLUSTER_DEFAULTS.progressTimeoutMs;
    this.#window = opts.window ?? CLUSTER_DEFAULTS.window;
    this.#metrics = opts.metrics === undefined ? undefined : routerMetrics(opts.metrics);
    this.#log = opts.log ?? (() => {});
    const peerLog = this.#peerLog = opts.peerLog ?? cappedLog(this.#log);
    const frames = nc.subscribe(subjects.frames(this.id), {
      callback: guarded((msg) => {
        const f = decodeMessage(StreamFrame, msg.data);
        if (!f.ok) return peerLog(`router: ignored a malformed frame: ${f.error}`);
        const v = f.value;
        if (v.type === "embedding") this.#embeds.get(v.stream)?.onAnswer(v.outcome);
        else this.#streams.get(v.stream)?.onFrame(v.seq, v.event);
      }, (e) => peerLog(`router: handling a frame failed: ${(e as Error).message}`)),
    });
    this.#subs = [announcements, frames];
    const e = info.embedding;
    if (e !== undefined) {
      this.embedder = {
        pooling: e.pooling,
        normalize: e.normalize,
        dimensions: e.dimensions,
        embed: (ids, signal, priority) =>
          this.#embed(ids, signal ?? new AbortController().signal, priority ?? "interactive"),
      };
    }
    this.#timer = setInterval(() => {
      try {
        this.#watch();
      } catch (e) {
        // An exception out of a timer ends the process: the router must outlive a bad tick.
        peerLog(`router: the stream watch failed: ${(e as Error).message}`);
      }
    }, 100);
  }

  /**
   * Connects the router role: listens to replica heartbeats and waits (up to waitMs) for one
   * replica to answer an info request, which gives the model's name, context and vocabulary.
   */
  static async start(
    nc: BusConnection,
    opts: RouterOptions & {
      waitMs?: number;
      staleAfterMs?: number;
      /** Route only to replicas serving this model (a router by model has one per model). */
      model?: string;
      /**
       * How long a replica may take to answer the info request (default 3 s). A replica of
       * several models loads the model first, which a router by model waits for.
       */
      infoTimeoutMs?: number;
    } = {},
  ): Promise<RouterBackend> {
    const log = opts.log ?? (() => {});
    const registry = new ReplicaRegistry({
      staleAfterMs: opts.staleAfterMs,
      log,
      ...(opts.model === undefined ? {} : { model: opts.model }),
    });
    let router: RouterBackend | undefined;
    let infoAsked: Promise<InfoReply | undefined> | undefined;
    const startedAt = performance.now();
    const askInfo = async (replica: string): Promise<InfoReply | undefined> => {
      try {
        const info = await requestInfo(
          nc,
          replica,
          opts.infoTimeoutMs ?? CLUSTER_DEFAULTS.infoTimeoutMs,
          opts.model,
        );
        // Asked for a model it had not loaded, the replica loaded it to answer.
        registry.noteWarming(replica);
        return info;
      } catch (e) {
        log(`router: replica ${replica} did not give its info: ${(e as Error).message}`);
        return undefined;
      }
    };
    const peerLog = opts.peerLog ?? cappedLog(log);
    const announcements = nc.subscribe(subjects.announce, {
      callback: guarded((msg) => {
        const a = decodeMessage(ReplicaAnnouncement, msg.data);
        if (!a.ok) return peerLog(`router: ignored a malformed announcement: ${a.error}`);
        if (a.value.type === "goodbye") {
          if (router) router.#onGoodbye(a.value.replica);
          else registry.onGoodbye(a.value.replica);
          return;
        }
        if (router) return router.#onHeartbeat(a.value);
        const listed = opts.model === undefined
          ? undefined
          : servedModels(a.value).find((m) => m.name === opts.model);
        // A replica with the model loaded answers at once; one without loads it to answer, so
        // those are asked only when, after the first beats, none has it loaded.
        const wanted = opts.model === undefined ||
          (listed !== undefined &&
            (listed.phase !== "unloaded" || performance.now() - startedAt > 600));
        if (infoAsked === undefined && !a.value.draining && wanted) {
          infoAsked = askInfo(a.value.replica).then((info) => {
            if (info === undefined) infoAsked = undefined;
            return info;
          });
        }
        registry.onHeartbeat(a.value);
      }, (e) => peerLog(`router: handling an announcement failed: ${(e as Error).message}`)),
    });
    const waitMs = opts.waitMs ?? CLUSTER_DEFAULTS.replicaWaitMs;
    const deadline = performance.now() + waitMs;
    for (;;) {
      const info = await infoAsked;
      if (info !== undefined) {
        registry.model = info.modelName;
        registry.modelId = info.modelId;
        router = new RouterBackend(nc, info, registry, announcements, {
          ...opts,
          peerLog,
          ...(opts.model === undefined ? {} : { model: opts.model }),
        });
        return router;
      }
      if (performance.now() > deadline) {
        announcements.unsubscribe();
        throw new Error(
          `No replica${
            opts.model === undefined ? "" : ` serving ${JSON.stringify(opts.model)}`
          } answered on NATS within ${waitMs / 1000} s: start one with ` +
            `'deno task start --nats <url>' pointing at the same server and credentials`,
        );
      }
      await delay(100);
    }
  }

  stats(): CoreStats {
    const live = this.registry.inRotation();
    let running = 0, waiting = 0, used = 0, total = 0, hit = 0, query = 0;
    for (const v of live) {
      const l = v.heartbeat.load;
      // A replica of several models: this model's own scheduler (0 while it is not loaded).
      const own = v.heartbeat.models !== undefined;
      running += own ? v.entry.running ?? 0 : l.running;
      waiting += own ? v.entry.waiting ?? 0 : l.waiting;
      used += l.kvBlocksUsed;
      total += l.kvBlocksTotal;
      hit += l.prefixHitTokens;
      query += l.prefixQueryTokens;
    }
    this.#updateReplicaGauge();
    return {
      running,
      waiting,
      kvBlocksUsed: used,
      kvBlocksTotal: total,
      prefixCacheHitRate: query === 0 ? 0 : hit / query,
      // The replicas run the steps: this router has no step count or batch size of its own.
      executorHealthy: live.length > 0,
    };
  }

  readinessProblems(): string[] {
    return this.registry.readinessProblems();
  }

  /** Stops listening; open streams are told their client is gone. */
  close(): void {
    this.#closed = true;
    clearInterval(this.#timer);
    for (const s of this.#streams.values()) this.#cancel(s, "gone");
    for (const e of this.#embeds.values()) {
      this.#publish(subjects.requests(e.replica), { type: "cancel", stream: e.id, how: "gone" });
      e.onAnswer({ kind: "error", code: "draining", message: "The router is stopping" });
    }
    for (const sub of this.#subs) sub.unsubscribe();
  }

  generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent> {
    return this.#generate(req, signal);
  }

  #onHeartbeat(hb: Parameters<ReplicaRegistry["onHeartbeat"]>[0]): void {
    const v = this.registry.onHeartbeat(hb);
    if (v === undefined) return;
    const listed = new Set(hb.streamIds);
    // A beat proves the replica lives; it proves a stream lives once the replica lists it. A
    // replica whose main thread is busy (a long CPU step) may read a new request late, so a
    // stream it has not listed yet is given UNLISTED_GRACE_MS before only its frames count.
    const now = performance.now();
    for (const s of [...this.#streams.values(), ...this.#embeds.values()]) {
      if (s.replica !== hb.replica) continue;
      if (listed.has(s.id) || now - s.openedAt < UNLISTED_GRACE_MS) s.markAlive();
    }
  }

  #onGoodbye(replica: string): void {
    this.registry.onGoodbye(replica);
    for (const s of [...this.#streams.values(), ...this.#embeds.values()]) {
      if (s.replica === replica) s.lose({ kind: "replica_gone", replica });
    }
  }

  /** Liveness of every stream (NATS says nothing when a replica dies) and credit refresh. */
  #watch(): void {
    const now = performance.now();
    // A late tick means this process was not running: frames and heartbeats may be waiting
    // unread, so the gap is not counted against the replicas.
    const late = now - this.#lastWatch - 200;
    this.#lastWatch = now;
    if (late > 0) {
      this.registry.forgive(late);
      for (const s of this.#streams.values()) s.lastActivity += late;
      for (const e of this.#embeds.values()) e.lastActivity += late;
    }
    for (const e of this.#embeds.values()) {
      if (now - e.lastActivity > this.#streamTimeoutMs) {
        e.lose({ kind: "timed_out", replica: e.replica, silentMs: now - e.lastActivity });
      } else if (now - e.openedAt > this.#progressTimeoutMs) {
        e.lose({ kind: "no_progress", replica: e.replica, quietMs: now - e.openedAt });
      }
    }
    for (const s of this.#streams.values()) {
      if (s.lost || s.ended) continue;
      if (now - s.lastActivity > this.#streamTimeoutMs) {
        s.lose({ kind: "timed_out", replica: s.replica, silentMs: now - s.lastActivity });
      } else if (now - s.lastFrameAt > this.#progressTimeoutMs) {
        s.lose({ kind: "no_progress", replica: s.replica, quietMs: now - s.lastFrameAt });
      } else if (now - s.lastGrantAt > 500 && now - s.lastFrameAt > 250) {
        // Heartbeats listing the stream keep lastActivity fresh: quiet means no frame.
        s.regrant();
      }
    }
    this.registry.prune();
  }

  #updateReplicaGauge(): void {
    const m = this.#metrics;
    if (!m) return;
    let ready = 0, draining = 0, stale = 0;
    for (const v of this.registry.all()) {
      if (!this.registry.isLive(v)) stale++;
      else if (v.heartbeat.draining) draining++;
      else ready++;
    }
    m.replicas.set(ready, { state: "ready" });
    m.replicas.set(draining, { state: "draining" });
    m.replicas.set(stale, { state: "stale" });
  }

  #cancel(s: RemoteStream, how: "cancel" | "gone"): void {
    this.#publish(subjects.requests(s.replica), { type: "cancel", stream: s.id, how });
  }

  /**
   * A publish from a timer or a callback: one that throws there ends the process (a heartbeat
   * with a space in its id made the credit refresh throw InvalidSubjectError), so it is logged.
   */
  #publish(subject: string, message: unknown): void {
    if (this.#nc.isClosed()) return;
    try {
      this.#nc.publish(subject, encodeMessage(message));
    } catch (e) {
      this.#peerLog(`router: cannot publish on ${subject}: ${(e as Error).message}`);
    }
  }

  /**
   * Sends a generate request and registers its stream, or answers why it cannot be sent: a
   * request over the server's max_payload is refused before anything is counted (the publish
   * threw after the replica's slot was taken, so slots leaked until every request got 503).
   */
  #open(
    replica: string,
    body: GenerateBody,
  ): RemoteStream | Extract<GenerationEvent, { type: "error" }> {
    const id = randomId("s");
    const msg: Generate = {
      type: "generate",
      stream: id,
      replyTo: subjects.frames(this.id),
      credit: this.#window,
      ...body,
    };
    const bytes = encodeMessage(msg);
    const maxPayload = this.#nc.info?.max_payload ?? CLUSTER_DEFAULTS.maxPayloadBytes;
    if (bytes.length > maxPayload) {
      return {
        type: "error",
        code: "payload_too_large",
        message: `The request is ${bytes.length} bytes as sent to a replica (prompt as ` +
          `${body.prompt.length} token ids, ${body.stop.length} stop strings of ` +
          `${body.stop.reduce((n, s) => n + s.length, 0)} characters), over the NATS server's ` +
          `max_payload of ${maxPayload} bytes; shorten the prompt or the stop strings`,
      };
    }
    const stream = new RemoteStream({
      id,
      replica,
      window: this.#window,
      sendCredit: (upTo) =>
        this.#publish(subjects.requests(replica), {
          type: "credit",
          stream: id,
          upTo,
          next: stream.nextSeq,
        }),
    });
    try {
      this.#nc.publish(subjects.requests(replica), bytes);
    } catch (e) {
      return {
        type: "error",
        code: "internal",
        message: `Cannot send the request to replica ${replica}: ${(e as Error).message}`,
      };
    }
    this.#streams.set(id, stream);
    const view = this.registry.get(replica);
    if (view) view.open++;
    return stream;
  }

  #close(stream: RemoteStream): void {
    this.#streams.delete(stream.id);
    const view = this.registry.get(stream.replica);
    if (view) view.open = Math.max(0, view.open - 1);
  }

  async *#generate(req: GenerationRequest, signal: AbortSignal): AsyncGenerator<GenerationEvent> {
    const f = new Failover(req, req.prompt, performance.now(), this.#model);
    let current: RemoteStream | undefined;
    const onAbort = () => {
      if (current !== undefined && !current.lost) this.#cancel(current, "cancel");
    };
    signal.addEventListener("abort", onAbort, { once: true });
    try {
      for (;;) {
        if (signal.aborted) return yield f.finish("cancelled");
        if (f.left <= 0) return yield f.finish("length");
        const prompt = f.prompt();
        const hashes = new Map<number, number[]>();
        const hashesFor = (blockSize: number) => {
          let h = hashes.get(blockSize);
          if (h === undefined) {
            h = prefixBlockHashes(prompt, blockSize, cacheScopeRoot(req.cacheScope));
            hashes.set(blockSize, h);
          }
          return h;
        };
        const choice = chooseReplica(this.registry.candidates(hashesFor, f.avoid), {
          policy: this.#policy,
          turn: this.#turn++,
        });
        if (choice.kind !== "replica") {
          const end = f.noReplica(choice.kind, this.#failoverWaitMs);
          if (end !== undefined) return yield end;
          await delay(100);
          continue;
        }
        f.chosen();
        this.registry.noteRouted(
          choice.id,
          hashesFor(this.registry.get(choice.id)!.heartbeat.prefix.blockSize),
        );
        this.#metrics?.routed.inc({ reason: choice.reason });
        this.#metrics?.byReplica.inc({ replica: choice.id });
        const opened = this.#open(choice.id, f.request());
        if (!(opened instanceof RemoteStream)) return yield opened;
        const stream = current = opened;
        let end: AttemptEnd;
        try {
          end = yield* f.attempt(stream, signal);
        } finally {
          this.#close(stream);
          // Leaving early (client gone) or giving the stream up: the replica frees it.
          if (!stream.ended) this.#cancel(stream, "gone");
          current = undefined;
        }
        if (end.kind === "final") return;
        this.#lost(req, f, end.loss, signal);
      }
    } finally {
      signal.removeEventListener("abort", onAbort);
    }
  }

  /**
   * One input's embedding from a replica: chosen as a generation's is (no prefix to match: an
   * embedding never enters the prefix cache), asked again of another replica when its replica
   * is lost or refuses it (overloaded, draining), exactly as its own /v1/embeddings computes it.
   * With no replica to take it, it is refused at once, or after a loss waits up to the
   * failover wait; an EmbeddingError says why.
   */
  async #embed(
    ids: readonly number[],
    signal: AbortSignal,
    priority: Priority,
  ): Promise<Float32Array> {
    const body = {
      input: [...ids],
      priority,
      requestId: randomId("embed"),
      ...(this.#model === undefined ? {} : { model: this.#model }),
    };
    const avoid = new Set<string>();
    let refusal: EmbeddingError | undefined;
    let lostSince: number | undefined;
    for (;;) {
      if (signal.aborted || this.#closed) {
        throw new EmbeddingError("cancelled", "The embedding was cancelled");
      }
      const choice = chooseReplica(this.registry.candidates(() => [], avoid), {
        policy: this.#policy,
        turn: this.#turn++,
      });
      if (choice.kind !== "replica") {
        if (lostSince === undefined) {
          throw refusal ?? new EmbeddingError("overloaded", NO_REPLICA[choice.kind]);
        }
        if (performance.now() - lostSince > this.#failoverWaitMs) {
          throw new EmbeddingError("internal", notTakenOver("embedding", this.#failoverWaitMs));
        }
        // Avoided replicas get another chance once none is left.
        avoid.clear();
        await delay(100);
        continue;
      }
      this.registry.noteRouted(choice.id, []);
      this.#metrics?.routed.inc({ reason: choice.reason });
      this.#metrics?.byReplica.inc({ replica: choice.id });
      const end = await this.#embedOn(choice.id, body, signal);
      if (end.kind === "lost") {
        lostSince ??= performance.now();
        if (avoidsReplica(end.loss)) avoid.add(end.loss.replica);
        this.#lostEmbedding(body.requestId, end.loss);
        continue;
      }
      const o = end.outcome;
      if (o.kind === "unsupported") {
        // A replica of the model without embeddings (another engine): another may have them;
        // with none left, its words are the client's 400.
        refusal = new EmbeddingError("invalid_request", o.message);
        avoid.add(choice.id);
        this.#lostEmbedding(body.requestId, { kind: "refused", replica: choice.id, code: o.kind });
        continue;
      }
      if (o.kind === "error") {
        if (o.code !== "overloaded" && o.code !== "draining") {
          throw new EmbeddingError(o.code, o.message);
        }
        // Refused before it began: another replica may take it.
        refusal = new EmbeddingError("overloaded", o.message);
        avoid.add(choice.id);
        this.#lostEmbedding(body.requestId, { kind: "refused", replica: choice.id, code: o.code });
        continue;
      }
      return this.#vectorOf(choice.id, o.data);
    }
  }

  /** One attempt on `replica`: its answer, its loss, or (the client left) cancelled. */
  async #embedOn(
    replica: string,
    body: Omit<Embed, "type" | "stream" | "replyTo">,
    signal: AbortSignal,
  ) {
    const id = randomId("e");
    const msg: Embed = { type: "embed", stream: id, replyTo: subjects.frames(this.id), ...body };
    const bytes = encodeMessage(msg);
    const maxPayload = this.#nc.info?.max_payload ?? CLUSTER_DEFAULTS.maxPayloadBytes;
    if (bytes.length > maxPayload) {
      throw new EmbeddingError(
        "payload_too_large",
        `The input is ${bytes.length} bytes as sent to a replica (${body.input.length} token ` +
          `ids), over the NATS server's max_payload of ${maxPayload} bytes; shorten it`,
      );
    }
    const attempt = new RemoteEmbedding(id, replica);
    try {
      this.#nc.publish(subjects.requests(replica), bytes);
    } catch (e) {
      throw new EmbeddingError(
        "internal",
        `Cannot send the embedding to replica ${replica}: ${(e as Error).message}`,
      );
    }
    this.#embeds.set(id, attempt);
    const view = this.registry.get(replica);
    if (view) view.open++;
    let onAbort!: () => void;
    const aborted = new Promise<"aborted">((resolve) => {
      onAbort = () => resolve("aborted");
      signal.addEventListener("abort", onAbort, { once: true });
      if (signal.aborted) onAbort();
    });
    let answered = false;
    try {
      const end = await Promise.race([attempt.ended, aborted]);
      if (end === "aborted") throw new EmbeddingError("cancelled", "The embedding was cancelled");
      answered = end.kind === "answer";
      return end;
    } finally {
      signal.removeEventListener("abort", onAbort);
      this.#embeds.delete(id);
      if (view) view.open = Math.max(0, view.open - 1);
      // The client went away, or the attempt was given up (a replica that looks alive but sent
      // nothing): the replica frees it.
      if (!answered) {
        this.#publish(subjects.requests(replica), { type: "cancel", stream: id, how: "gone" });
      }
    }
  }

  /** A replica's vector, checked against the model's length. */
  #vectorOf(replica: string, data: string): Float32Array {
    const bytes = fromBase64(data);
    const dims = this.embedder!.dimensions;
    if (bytes.length !== dims * 4) {
      throw new EmbeddingError(
        "internal",
        `Replica ${replica} sent an embedding of ${bytes.length} bytes; the model's vectors ` +
          `are ${dims} float32 values (${dims * 4} bytes)`,
      );
    }
    return new Float32Array(bytes.buffer, bytes.byteOffset, dims);
  }

  #lostEmbedding(requestId: string, loss: StreamLoss): void {
    this.#metrics?.lostStreams.inc({ why: LOSS_LABEL[loss.kind] });
    this.#metrics?.embeddingRetries.inc();
    this.#log(
      `router: ${requestId}: embedding on ${loss.replica} lost (${loss.kind}: ${
        describeLoss(loss)
      }); asking another replica`,
    );
  }

  /** One attempt lost: counted by kind, logged, and (unless refused) a failover. */
  #lost(req: GenerationRequest, f: Failover, loss: StreamLoss, signal: AbortSignal): void {
    f.lost(loss);
    this.#metrics?.lostStreams.inc({ why: LOSS_LABEL[loss.kind] });
    if (loss.kind === "refused" || signal.aborted) return;
    if (f.left <= 0) {
      // Lost after its last token (the final frame): nothing is left to resubmit.
      this.#log(
        `router: ${req.requestId}: stream on ${loss.replica} lost (${loss.kind}: ${
          describeLoss(loss)
        }) after all ${f.delivered.length} tokens; ending it here`,
      );
      return;
    }
    this.failovers++;
    this.#metrics?.failovers.inc();
    this.#log(
      `router: ${req.requestId}: stream on ${loss.replica} lost (${loss.kind}: ${
        describeLoss(loss)
      }); resubmitting prompt + ${f.delivered.length} tokens`,
    );
  }
}
