import { CLUSTER_DEFAULTS } from "./cluster_defaults.ts";
import { deadline as within } from "@std/async/deadline";
import type { GenerationBackend, GenerationEvent } from "../core/generation.ts";
import {
  decodeMessage,
  type Embed,
  type EmbeddingFrame,
  encodeMessage,
  type Generate,
  type Heartbeat,
  type InfoReply,
  type Load,
  type ReplicaModel,
  ReplicaRequest,
} from "./messages.ts";
import { infoPartRanges, toBase64 } from "./info_parts.ts";
import { subjects } from "./subjects.ts";
import {
  type BusConnection,
  type BusMsg,
  type BusSubscription,
  cappedLog,
  guarded,
  type NatsOptions,
} from "./nats_connection.ts";
import { DRAINING_EVENT } from "../core/draining.ts";
import { EmbeddingError } from "../core/embedder.ts";

/** What a replica reports and serves, taken from the running server. */
export interface ReplicaSource {
  /** The server's own backend: NATS streams run through the same serving core as HTTP. */
  readonly backend: GenerationBackend;
  /** Model facts and vocabulary for routers (without the replica's id). */
  readonly info: Omit<InfoReply, "type" | "replica">;
  /** Further names its model is served by (besides info.modelName), for routers. */
  readonly aliases?: readonly string[];
  readonly blockSize: number;
  /** Scheduler load, streams excluded. */
  load(): Omit<Load, "streams">;
  cachedBlockHashes(limit: number): number[];
}

/** One model of a {@link ReplicaModels}, as its heartbeat lists it. */
export interface ReplicaModelState {
  readonly name: string;
  /** Further names it is served by (`--served-model-name alias=model`), for routers. */
  readonly aliases?: readonly string[];
  readonly modelId?: string;
  readonly phase: ReplicaModel["phase"];
  /** Its source while loaded. */
  readonly source?: ReplicaSource;
}

/**
 * A replica serving several models (a server of several models with --nats): each is loaded on
 * demand, by the first generate or info request naming it, through the server's model pool.
 */
export interface ReplicaModels {
  /** Every model it serves, the default (for a request naming none) first. */
  list(): readonly ReplicaModelState[];
  /**
   * The model's source, loaded first if need be, held (never unloaded) until release().
   * Rejects when the load fails; `insufficientMemory` on the error says it could not get room.
   */
  acquire(name: string): Promise<{ readonly source: ReplicaSource; release(): void }>;
  /** The scheduler limits every model's core runs with, and the KV block size. */
  readonly maxRunning: number;
  readonly maxWaiting: number;
  readonly blockSize: number;
}

/** How long close() waits for NATS to take the goodbye. */

export interface ReplicaAgentOptions {
  readonly id: string;
  /** Heartbeat period (default 250 ms; routers drop a replica silent for 1.5 s). */
  readonly heartbeatMs?: number;
  /** Prefix-cache hashes per heartbeat at most (default 4096). */
  readonly maxHashes?: number;
  /** A stream waiting this long for credit is given up: its router is gone (default 30 s). */
  readonly creditTimeoutMs?: number;
  readonly log?: (line: string) => void;
  /** The request log's record of one stream served over NATS (the caller writes the line). */
  readonly served?: (requestId: string, route: "generate" | "embed") => ServedLog;
}

/** What a stream served over NATS tells the request log, as an HTTP request's line would. */
export interface ServedLog {
  firstToken(): void;
  /** How it ended: its error code, or none for done; token counts when it finished. */
  finished(
    e: { code?: string; promptTokens?: number; completionTokens?: number; cached?: boolean },
  ): void;
}

type ServedLogOf = NonNullable<ReplicaAgentOptions["served"]>;

/** One generation served over NATS: events go out only as far as the router granted credit. */
class ServedStream {
  readonly ctrl = new AbortController();
  upTo: number;
  gone = false;
  /** Frames published so far, and when the last one was. */
  sent = 0;
  sentAt = 0;
  #wake: (() => void) | undefined;

  constructor(readonly msg: Generate) {
    this.upTo = msg.credit;
  }

  grant(upTo: number): void {
    if (upTo > this.upTo) this.upTo = upTo;
    this.#wakeUp();
  }

  abandon(): void {
    this.gone = true;
    this.#wakeUp();
  }

  #wakeUp(): void {
    const w = this.#wake;
    this.#wake = undefined;
    w?.();
  }

  /** Resolves true once frame `seq` may be sent, false if the stream is gone or the wait too long. */
  async creditFor(seq: number, timeoutMs: number): Promise<boolean> {
    const deadline = performance.now() + timeoutMs;
    while (!this.gone && seq >= this.upTo) {
      const left = deadline - performance.now();
      if (left <= 0) return false;
      let timer: ReturnType<typeof setTimeout> | undefined;
      await new Promise<void>((resolve) => {
        this.#wake = resolve;
        timer = setTimeout(resolve, left);
      });
      clearTimeout(timer);
    }
    return !this.gone;
  }
}

/**
 * The replica role: serves generate requests from routers on its own subject with the server's
 * serving core, streams each generation's events back with credit-based flow control, and
 * heartbeats its load, prefix-cache summary and open streams. drain() takes it out of the
 * rotation, lets its streams finish, then says goodbye.
 */
export class ReplicaAgent {
  readonly id: string;
  readonly #nc: BusConnection;
  /** A replica of one model has its source; one of several, its models. */
  readonly #src: ReplicaSource | undefined;
  readonly #models: ReplicaModels | undefined;
  readonly #heartbeatMs: number;
  readonly #maxHashes: number;
  readonly #creditTimeoutMs: number;
  readonly #log: (line: string) => void;
  readonly #served: ServedLogOf | undefined;
  /** For what peers cause: capped, since a peer decides how often and how long. */
  readonly #peerLog: (line: string) => void;
  readonly #streams = new Map<string, ServedStream>();
  /** Embeddings asked by routers and still running, by id (listed with the streams). */
  readonly #embeds = new Map<string, AbortController>();
  readonly #running = new Set<Promise<void>>();
  #sub: BusSubscription | undefined;
  #timer: ReturnType<typeof setInterval> | undefined;
  #beat = 0;
  #draining = false;
  #worker: Worker | undefined;
  /** Info replies, encoded once per model ("" for the one model of a single-model replica). */
  readonly #info = new Map<string, { bytes: Uint8Array; ranges: Array<[number, number]> }>();

  constructor(nc: BusConnection, source: ReplicaSource | ReplicaModels, opts: ReplicaAgentOptions) {
    this.#nc = nc;
    if ("acquire" in source) this.#models = source;
    else this.#src = source;
    this.id = opts.id;
    this.#heartbeatMs = opts.heartbeatMs ?? CLUSTER_DEFAULTS.heartbeatMs;
    this.#maxHashes = opts.maxHashes ?? CLUSTER_DEFAULTS.maxHashes;
    this.#creditTimeoutMs = opts.creditTimeoutMs ?? CLUSTER_DEFAULTS.creditTimeoutMs;
    this.#log = opts.log ?? (() => {});
    this.#served = opts.served;
    this.#peerLog = cappedLog(this.#log);
  }

  get streams(): number {
    return this.#streams.size;
  }

  get draining(): boolean {
    return this.#draining;
  }

  /**
   * Subscribes to its request subject and starts heartbeating (the first beat at once). With
   * `workerNats`, heartbeats come from a worker thread with its own connection made with
   * those options (see heartbeat_worker.ts); without, from this thread.
   */
  async start(workerNats?: NatsOptions): Promise<void> {
    this.#sub = this.#nc.subscribe(subjects.requests(this.id), {
      callback: guarded(
        (msg) => this.#onRequest(msg),
        (e) => this.#peerLog(`replica ${this.id}: a request failed: ${(e as Error).message}`),
      ),
    });
    await this.#nc.flush();
    if (workerNats !== undefined) {
      try {
        this.#worker = await startHeartbeatWorker(workerNats, this.#snapshot(), this.#heartbeatMs);
      } catch (e) {
        // Without the worker a long CPU step delays heartbeats (routers may take the replica
        // for dead meanwhile), but it still serves: say so rather than refuse to start.
        this.#log(
          `replica ${this.id}: heartbeats from the main thread (${(e as Error).message})`,
        );
      }
    }
    if (this.#worker === undefined) this.#heartbeat();
    this.#timer = setInterval(() => this.#heartbeat(), this.#heartbeatMs);
  }

  /**
   * Rolling-update order: leave the rotation (a draining heartbeat, sent now), let in-flight
   * streams finish (up to timeoutMs, then end them), say goodbye, stop.
   */
  async drain(timeoutMs: number): Promise<{ completed: boolean; aborted: number }> {
    this.#draining = true;
    this.#heartbeat();
    const deadline = performance.now() + timeoutMs;
    while (this.#running.size > 0 && performance.now() < deadline) {
      await Promise.race([
        Promise.all(this.#running),
        new Promise((r) => setTimeout(r, Math.max(1, deadline - performance.now()))),
      ]);
    }
    const aborted = this.#streams.size + this.#embeds.size;
    for (const s of this.#streams.values()) s.ctrl.abort("drain deadline passed");
    for (const e of this.#embeds.values()) e.abort("drain deadline passed");
    await Promise.race([Promise.all(this.#running), new Promise((r) => setTimeout(r, 1000))]);
    await this.close();
    return { completed: aborted === 0, aborted };
  }

  /** Stops heartbeats, says goodbye and unsubscribes (streams still open are left to end). */
  async close(): Promise<void> {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
    const w = this.#worker;
    this.#worker = undefined;
    if (w !== undefined) {
      const stopped = new Promise<void>((resolve) => {
        w.onmessage = (e) => {
          if ((e.data as { type: string }).type === "stopped") resolve();
        };
      });
      w.postMessage({ type: "stop" });
      await Promise.race([stopped, new Promise((r) => setTimeout(r, 2000))]);
      w.terminate();
    }
    if (!this.#nc.isClosed()) {
      try {
        this.#nc.publish(subjects.announce, encodeMessage({ type: "goodbye", replica: this.id }));
      } catch (e) {
        this.#log(`replica ${this.id}: goodbye not sent: ${(e as Error).message}`);
      }
      this.#sub?.unsubscribe();
      // The client fails a flush at its next reconnect attempt when the server is gone, but
      // one that is up and silent (stopped, cut off) holds it until the pings time out, 30 s
      // and more: the goodbye is best effort, the stop must not wait on it.
      await within(this.#nc.flush(), CLUSTER_DEFAULTS.goodbyeFlushMs).catch(() => {});
    }
  }

  /** Sends the current state: through the worker, or directly. */
  #heartbeat(): void {
    if (this.#nc.isClosed()) return;
    if (this.#worker !== undefined) {
      this.#worker.postMessage({ type: "snapshot", snapshot: this.#snapshot() });
      if (this.#draining) this.#worker.postMessage({ type: "beat" });
      return;
    }
    const hb: Heartbeat = { ...this.#snapshot(), beat: this.#beat++, stalledMs: 0 };
    try {
      this.#nc.publish(subjects.announce, encodeMessage(hb));
    } catch (e) {
      this.#peerLog(`replica ${this.id}: cannot send a heartbeat: ${(e as Error).message}`);
    }
  }

  #snapshot(): Omit<Heartbeat, "beat" | "stalledMs"> {
    if (this.#models !== undefined) return this.#modelsSnapshot(this.#models);
    const src = this.#src!;
    return {
      type: "heartbeat",
      replica: this.id,
      intervalMs: this.#heartbeatMs,
      draining: this.#draining,
      model: src.info.modelName,
      ...(src.aliases?.length ? { aliases: [...src.aliases] } : {}),
      modelId: src.info.modelId,
      load: { ...src.load(), streams: this.#streams.size },
      prefix: {
        blockSize: src.blockSize,
        hashes: src.cachedBlockHashes(this.#maxHashes),
      },
      streamIds: this.#workIds(),
    };
  }

  /**
   * A replica of several models: each listed with its phase, and while loaded its own load and
   * hashes (the hash budget shared among the loaded ones); `load` holds the totals.
   */
  #modelsSnapshot(models: ReplicaModels): Omit<Heartbeat, "beat" | "stalledMs"> {
    const list = models.list();
    const loaded = list.filter((m) => m.source !== undefined).length;
    const perModel = loaded === 0 ? 0 : Math.floor(this.#maxHashes / loaded);
    const total = {
      running: 0,
      waiting: 0,
      kvBlocksUsed: 0,
      kvBlocksTotal: 0,
      prefixQueryTokens: 0,
      prefixHitTokens: 0,
    };
    const entries: ReplicaModel[] = list.map((m) => {
      const base = {
        name: m.name,
        ...(m.aliases === undefined || m.aliases.length === 0 ? {} : { aliases: [...m.aliases] }),
        ...(m.modelId === undefined ? {} : { modelId: m.modelId }),
      };
      if (m.source === undefined) {
        return { ...base, phase: m.phase === "loaded" ? "loading" : m.phase };
      }
      const l = m.source.load();
      for (const k of Object.keys(total) as (keyof typeof total)[]) total[k] += l[k];
      return {
        ...base,
        phase: "loaded",
        running: l.running,
        waiting: l.waiting,
        hashes: m.source.cachedBlockHashes(perModel),
      };
    });
    const first = list[0];
    return {
      type: "heartbeat",
      replica: this.id,
      intervalMs: this.#heartbeatMs,
      draining: this.#draining,
      model: first?.name ?? "",
      ...(first?.modelId === undefined ? {} : { modelId: first.modelId }),
      load: {
        ...total,
        maxRunning: models.maxRunning,
        maxWaiting: models.maxWaiting,
        streams: this.#streams.size,
      },
      prefix: { blockSize: models.blockSize, hashes: [] },
      streamIds: this.#workIds(),
      models: entries,
    };
  }

  /** Ids of the streams and embeddings served now: each router's liveness evidence. */
  #workIds(): string[] {
    return [...this.#streams.keys(), ...this.#embeds.keys()];
  }

  /** A model's info reply, encoded once and split for the connection's max_payload. */
  #infoParts(
    key: string,
    src: ReplicaSource,
  ): { bytes: Uint8Array; ranges: Array<[number, number]> } {
    let parts = this.#info.get(key);
    if (parts === undefined) {
      const bytes = encodeMessage({ type: "info", replica: this.id, ...src.info });
      const maxPayload = this.#nc.info?.max_payload ?? CLUSTER_DEFAULTS.maxPayloadBytes;
      this.#info.set(key, parts = { bytes, ranges: infoPartRanges(bytes.length, maxPayload) });
    }
    return parts;
  }

  /** Answers an info request; a replica of several models loads the model to learn its facts. */
  async #answerInfo(msg: BusMsg, part: number, model: string | undefined): Promise<void> {
    let parts;
    if (this.#models === undefined) {
      parts = this.#infoParts("", this.#src!);
    } else {
      const name = model ?? this.#models.list()[0]?.name ?? "";
      parts = this.#info.get(name);
      if (parts === undefined) {
        if (!this.#models.list().some((m) => m.name === name)) {
          this.#peerLog(
            `replica ${this.id}: ignored an info request for model ${
              JSON.stringify(name)
            }, which it does not serve`,
          );
          return;
        }
        let held;
        try {
          held = await this.#models.acquire(name);
        } catch (e) {
          this.#log(
            `replica ${this.id}: no info for model ${JSON.stringify(name)}: ${
              (e as Error).message
            }`,
          );
          return;
        }
        try {
          parts = this.#infoParts(name, held.source);
        } finally {
          held.release();
        }
      }
    }
    const range = parts.ranges[part];
    if (range === undefined) {
      this.#peerLog(
        `replica ${this.id}: ignored a request for info part ${part} of ` +
          `${parts.ranges.length}`,
      );
      return;
    }
    msg.respond(encodeMessage({
      type: "info_part",
      replica: this.id,
      part,
      parts: parts.ranges.length,
      bytes: parts.bytes.length,
      data: toBase64(parts.bytes.subarray(range[0], range[1])),
    }));
  }

  #onRequest(msg: BusMsg): void {
    const parsed = decodeMessage(ReplicaRequest, msg.data);
    if (!parsed.ok) {
      this.#peerLog(`replica ${this.id}: ignored a malformed request: ${parsed.error}`);
      return;
    }
    const req = parsed.value;
    switch (req.type) {
      case "info": {
        this.#answerInfo(msg, req.part, req.model).catch((e) =>
          this.#peerLog(`replica ${this.id}: an info request failed: ${(e as Error).message}`)
        );
        return;
      }
      case "credit": {
        const s = this.#streams.get(req.stream);
        if (s === undefined) return;
        // Frames in flight are microseconds old: only ones unacknowledged for a second, on a
        // stream waiting for credit, count as lost.
        if (
          req.next !== undefined && req.next < s.sent && s.sent >= s.upTo &&
          performance.now() - s.sentAt > 1000
        ) {
          // Frames it sent never reached the router (lost across a reconnect): the stream
          // cannot go on, and waiting for credit would hold it until the credit timeout. Given
          // up, it leaves the heartbeats and the router fails over at once, exactly.
          this.#log(
            `replica ${this.id}: stream ${req.stream} lost frames ${req.next}..${
              s.sent - 1
            } on the way; giving it up`,
          );
          s.abandon();
          return;
        }
        s.grant(req.upTo);
        return;
      }
      case "cancel": {
        this.#embeds.get(req.stream)?.abort("cancelled by the router");
        const s = this.#streams.get(req.stream);
        if (s === undefined) return;
        if (req.how === "cancel") s.ctrl.abort("cancelled by the client");
        else s.abandon();
        return;
      }
      case "embed": {
        if (this.#embeds.has(req.stream) || this.#streams.has(req.stream)) return;
        const ctrl = new AbortController();
        this.#embeds.set(req.stream, ctrl);
        const run = this.#embed(req, ctrl.signal).finally(() => {
          this.#embeds.delete(req.stream);
          this.#running.delete(run);
        });
        this.#running.add(run);
        return;
      }
      case "generate": {
        if (this.#streams.has(req.stream)) return;
        const s = new ServedStream(req);
        this.#streams.set(req.stream, s);
        const run = this.#serve(s).finally(() => {
          this.#streams.delete(req.stream);
          this.#running.delete(run);
        });
        this.#running.add(run);
        return;
      }
    }
  }

  async #serve(s: ServedStream): Promise<void> {
    const m = s.msg;
    let seq = 0;
    // A publish that throws (the connection closed, a frame over max_payload) must not leave
    // the catch below throwing again: that was an unhandled rejection, the end of the process.
    let sendFailed = false;
    const record = this.#served?.(m.requestId, "generate");
    let ended = false;
    const logEnd = (e: Parameters<ServedLog["finished"]>[0]) => {
      if (ended) return;
      ended = true;
      record?.finished(e);
    };
    const send = (event: GenerationEvent) => {
      if (event.type === "token") record?.firstToken();
      else if (event.type === "done") {
        logEnd({
          promptTokens: event.usage.promptTokens,
          completionTokens: event.usage.completionTokens,
          cached: event.cached !== undefined,
        });
      } else if (event.type === "error") logEnd({ code: event.code });
      if (sendFailed || this.#nc.isClosed()) return;
      try {
        this.#nc.publish(
          m.replyTo,
          encodeMessage({ type: "event", stream: m.stream, seq: seq++, event }),
        );
        s.sent = seq;
        s.sentAt = performance.now();
      } catch (e) {
        sendFailed = true;
        this.#peerLog(
          `replica ${this.id}: cannot send stream ${m.stream} to ${m.replyTo}: ${
            (e as Error).message
          }`,
        );
        s.ctrl.abort("cannot reach the router");
      }
    };
    if (this.#draining) {
      send(DRAINING_EVENT);
      return;
    }
    const held = await this.#backendFor(m.model);
    if ("type" in held) {
      send(held);
      return;
    }
    const { backend, release } = held;
    const events = backend.generate({
      prompt: m.prompt,
      maxTokens: m.maxTokens,
      sampling: m.sampling,
      stop: m.stop,
      stopTokenIds: m.stopTokenIds,
      ...(m.ignoreEos ? { ignoreEos: true } : {}),
      ...(m.controls !== undefined ? { controls: m.controls } : {}),
      ...(m.generated !== undefined ? { generated: m.generated } : {}),
      ...(m.topLogprobs ? { topLogprobs: m.topLogprobs } : {}),
      priority: m.priority,
      requestId: m.requestId,
      logprobs: m.logprobs,
      cacheScope: m.cacheScope,
      ...(m.deterministic && m.generated === undefined ? { deterministic: true } : {}),
      ...(m.noCache ? { noCache: true } : {}),
      ...(m.constraint
        ? { constraint: m.constraint, constraintReplay: m.constraintReplay ?? 0 }
        : {}),
    }, s.ctrl.signal)[Symbol.asyncIterator]();
    try {
      for (;;) {
        const next = await events.next();
        if (next.done) return;
        if (!await s.creditFor(seq, this.#creditTimeoutMs)) return;
        if (this.#nc.isClosed() || sendFailed) return;
        send(next.value);
        if (next.value.type === "done" || next.value.type === "error") return;
      }
    } catch (e) {
      this.#log(`replica ${this.id}: stream ${m.stream} failed: ${(e as Error).message}`);
      send({ type: "error", code: "internal", message: `Generation failed: ${e}` });
    } finally {
      // Leaving early (credit never came, router gone) frees the sequence's KV blocks.
      logEnd({ code: "router_gone" });
      await events.return?.(undefined);
      release();
    }
  }

  /**
   * The backend a request naming `model` runs on, held until release(); or the error event that
   * answers it: a model this replica does not serve, or one it cannot load now (no room is a
   * refusal, so the router tries another replica). A cancel that comes during a load reaches
   * the work through its aborted signal.
   */
  async #backendFor(
    model: string | undefined,
  ): Promise<
    | { backend: GenerationBackend; release: () => void }
    | Extract<GenerationEvent, { type: "error" }>
  > {
    if (this.#models === undefined) {
      const own = this.#src!.info.modelName;
      if (model !== undefined && model !== own) {
        return {
          type: "error",
          code: "invalid_request",
          message: `This replica serves model ${JSON.stringify(own)}, not ${JSON.stringify(model)}`,
        };
      }
      return { backend: this.#src!.backend, release: () => {} };
    }
    const list = this.#models.list();
    const name = model ?? list[0]?.name ?? "";
    if (!list.some((x) => x.name === name)) {
      return {
        type: "error",
        code: "invalid_request",
        message: `This replica does not serve model ${JSON.stringify(name)}; it serves ${
          list.map((x) => JSON.stringify(x.name)).join(", ")
        }`,
      };
    }
    try {
      const held = await this.#models.acquire(name);
      return { backend: held.source.backend, release: () => held.release() };
    } catch (e) {
      const message = (e as Error).message;
      const noRoom = (e as { insufficientMemory?: boolean }).insufficientMemory === true;
      return { type: "error", code: noRoom ? "overloaded" : "internal", message };
    }
  }

  /**
   * One input's embedding for a router, through the model's own embedding path (what its
   * /v1/embeddings gives), answered with one frame; nothing when the router cancelled it.
   */
  async #embed(m: Embed, signal: AbortSignal): Promise<void> {
    const record = this.#served?.(m.requestId, "embed");
    const reply = (outcome: EmbeddingFrame["outcome"]) => {
      record?.finished(
        outcome.kind === "error"
          ? { code: outcome.code }
          : outcome.kind === "unsupported"
          ? { code: "invalid_request" }
          : { promptTokens: m.input.length, completionTokens: 0 },
      );
      if (this.#nc.isClosed()) return;
      const frame: EmbeddingFrame = { type: "embedding", stream: m.stream, outcome };
      try {
        this.#nc.publish(m.replyTo, encodeMessage(frame));
      } catch (e) {
        this.#peerLog(
          `replica ${this.id}: cannot send embedding ${m.stream} to ${m.replyTo}: ${
            (e as Error).message
          }`,
        );
      }
    };
    if (this.#draining) {
      return reply({ kind: "error", code: "draining", message: DRAINING_EVENT.message });
    }
    const held = await this.#backendFor(m.model);
    if ("type" in held) return reply({ kind: "error", code: held.code, message: held.message });
    try {
      const embedder = held.backend.embedder;
      if (embedder === undefined) {
        return reply({
          kind: "unsupported",
          message: `Replica ${this.id} serves no embeddings of ${
            JSON.stringify(m.model ?? held.backend.modelName)
          }: its engine returns no hidden states (run it with --backend cpu)`,
        });
      }
      const v = await embedder.embed(m.input, signal, m.priority);
      // Cancelled while its last step ran: computed, but nobody reads it.
      if (signal.aborted) return record?.finished({ code: "router_gone" });
      reply({
        kind: "vector",
        data: toBase64(new Uint8Array(v.buffer, v.byteOffset, v.byteLength)),
      });
    } catch (e) {
      if (signal.aborted) return record?.finished({ code: "router_gone" });
      const code = e instanceof EmbeddingError && e.code !== "cancelled" ? e.code : "internal";
      reply({ kind: "error", code, message: (e as Error).message });
    } finally {
      held.release();
    }
  }
}

/** Starts heartbeat_worker.ts and resolves once it has connected and sent its first beat. */
async function startHeartbeatWorker(
  nats: NatsOptions,
  snapshot: Omit<Heartbeat, "beat" | "stalledMs">,
  intervalMs: number,
): Promise<Worker> {
  const w = new Worker(new URL("./heartbeat_worker.ts", import.meta.url).href, { type: "module" });
  try {
    await new Promise<void>((resolve, reject) => {
      w.onmessage = (e) => {
        if ((e.data as { type: string }).type === "started") resolve();
      };
      w.onerror = (e) => {
        e.preventDefault();
        reject(new Error(`the heartbeat worker failed: ${e.message}`));
      };
      w.postMessage({ type: "start", nats, snapshot, intervalMs });
    });
  } catch (e) {
    w.terminate();
    throw e;
  }
  return w;
}
