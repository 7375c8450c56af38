/**
 * The head's side of a remote pipeline stage: finding it by its announcement, checking that it
 * runs the model file and layers the head expects, attaching over NATS, and the direct TCP link
 * (RemoteStage, a StageLink) its steps then travel on.
 */
import type { KvGeometry, StepPlan } from "../engine/engine.ts";
import type { LayerRange, StageLink, StageOutput } from "../engine/stage_link.ts";
import { decodeFrame, encodeFrame } from "./binary_frame.ts";
import { FrameReader, FrameWriter } from "./frame_stream.ts";
import type { BusConnection } from "./nats_connection.ts";
import {
  type LinkReply,
  LinkReplySchema,
  parseMessage,
  STAGE_HEARTBEAT_MISSES,
  STAGE_HEARTBEAT_MS,
  type StageAnnouncement,
  StageAnnouncementSchema,
  StageAttachReplySchema,
} from "./stage_messages.ts";
import { MAX_LINK_FRAME } from "./stage_server.ts";
import { subjects } from "./subjects.ts";
import type { GatherLink } from "./tp_link.ts";

/** What the head needs of its stages. */
export interface StageWanted {
  /** modelIdentity() of the head's file and context. */
  readonly model: string;
  /** The layer ranges of the remote stages, in order. */
  readonly ranges: readonly LayerRange[];
  /**
   * A tensor-parallel group of this size instead, the head being rank 0: ranks 1.. of every
   * layer (`ranges` is then the one whole range).
   */
  readonly tpSize?: number;
  readonly kv: KvGeometry;
  readonly limits: { readonly maxSeqs: number; readonly maxBatchTokens: number };
  /** The context the head serves, at most the stages' own. */
  readonly contextLength: number;
  /** How long to wait for the stages' announcements. */
  readonly timeoutMs: number;
}

const same = (a: LayerRange, b: LayerRange) => a.start === b.start && a.end === b.end;

/** Why an announced stage cannot serve `range` of `model`, or undefined when it can. */
export function stageMismatch(
  a: StageAnnouncement,
  model: string,
  range: LayerRange,
): string | undefined {
  if (a.model !== model) {
    return `stage ${a.id} serves model ${a.model}, the head runs ${model} (a different file or context)`;
  }
  if (!same(a.layers, range)) {
    return `stage ${a.id} advertises layers ${a.layers.start}-${a.layers.end}, the head needs ${range.start}-${range.end}`;
  }
  return undefined;
}

/**
 * Waits for an announced stage of each wanted range, attaches to each and opens its link.
 * Throws, after the timeout, naming each range still missing and what was announced instead.
 */
export async function attachStages(nc: BusConnection, w: StageWanted): Promise<RemoteStage[]> {
  const slots = slotsOf(w);
  const found = new Map<number, StageAnnouncement>();
  const refused = new Map<string, string>();
  let done!: () => void;
  const all = new Promise<void>((r) => (done = r));
  const sub = nc.subscribe(subjects.stages, {
    callback: (_err, msg) => {
      let a: StageAnnouncement;
      try {
        a = parseMessage(
          StageAnnouncementSchema,
          JSON.parse(new TextDecoder().decode(msg.data)),
          "stage announcement",
        );
      } catch (e) {
        refused.set("(malformed)", (e as Error).message);
        return;
      }
      const i = slots.findIndex((s) =>
        same(s.range, a.layers) && s.tp?.rank === a.tp?.rank && s.tp?.size === a.tp?.size
      );
      const why = stageMismatch(a, w.model, slots[i]?.range ?? slots[0]!.range);
      if (why !== undefined || i < 0) {
        refused.set(
          a.id,
          why ??
            `stage ${a.id} advertises layers ${a.layers.start}-${a.layers.end}${
              a.tp ? ` as tensor-parallel rank ${a.tp.rank} of ${a.tp.size}` : ""
            }, which the head does not want`,
        );
        return;
      }
      if (!found.has(i)) found.set(i, a);
      if (found.size === slots.length) done();
    },
  });
  const timer = setTimeout(done, w.timeoutMs);
  await all;
  clearTimeout(timer);
  sub.unsubscribe();
  const missing = slots.filter((_, i) => !found.has(i));
  if (missing.length > 0) {
    throw new Error(
      `Cannot start the pipeline: no stage announced layers ${
        missing.map(({ range: r, tp }) =>
          `${r.start}-${r.end}${tp ? ` as tensor-parallel rank ${tp.rank} of ${tp.size}` : ""}`
        ).join(", ")
      } of model ${w.model} within ${w.timeoutMs} ms${
        refused.size > 0 ? `; refused: ${[...refused.values()].join("; ")}` : ""
      }`,
    );
  }
  const links: RemoteStage[] = [];
  try {
    for (let i = 0; i < slots.length; i++) links.push(await attachOne(nc, found.get(i)!, w));
  } catch (e) {
    for (const l of links) l.dispose();
    throw e;
  }
  return links;
}

/** The stages wanted: one per range, or the ranks 1.. of a tensor-parallel group. */
function slotsOf(w: StageWanted): { range: LayerRange; tp?: { rank: number; size: number } }[] {
  if (w.tpSize === undefined) return w.ranges.map((range) => ({ range }));
  return Array.from(
    { length: w.tpSize - 1 },
    (_, i) => ({ range: w.ranges[0]!, tp: { rank: i + 1, size: w.tpSize! } }),
  );
}

async function attachOne(
  nc: BusConnection,
  a: StageAnnouncement,
  w: StageWanted,
): Promise<RemoteStage> {
  const req = {
    type: "attach",
    model: w.model,
    layers: a.layers,
    ...(a.tp ? { tp: a.tp } : {}),
    kv: w.kv,
    limits: w.limits,
    contextLength: w.contextLength,
  };
  const msg = await nc.request(
    subjects.stage(a.id),
    new TextEncoder().encode(JSON.stringify(req)),
    {
      timeout: w.timeoutMs,
    },
  );
  const reply = parseMessage(
    StageAttachReplySchema,
    JSON.parse(new TextDecoder().decode(msg.data)),
    `attach reply of stage ${a.id}`,
  );
  if (reply.type === "refused") throw new Error(`Stage ${a.id} refused the head: ${reply.message}`);
  return await RemoteStage.connect(a, reply.ticket);
}

/** A stage in another process, over its direct TCP link. Steps are answered in order. */
export class RemoteStage implements StageLink, GatherLink {
  /** A tensor-parallel rank's columns of each gather (tp_link.ts's HubGather sets it). */
  onGather?: (cols: Float32Array) => void;
  onLost?: (e: Error) => void;
  readonly #pending: { resolve: (r: LinkReply) => void; reject: (e: Error) => void }[] = [];
  readonly #writer: FrameWriter;
  #gone: Error | undefined;
  #heartbeat: ReturnType<typeof setInterval> | undefined;
  #pings = 0;
  /** Pings sent since the stage last answered one. */
  #unanswered = 0;
  /** True once the link failed on the stage's side (it closed, broke or hung), not disposed. */
  stageGone = false;

  private constructor(readonly ann: StageAnnouncement, readonly conn: Deno.TcpConn) {
    this.#writer = new FrameWriter(conn);
    this.#read().catch((e) => this.#lost(e));
  }

  /** Pings every STAGE_HEARTBEAT_MS; a stage that leaves STAGE_HEARTBEAT_MISSES unanswered is dead. */
  #beat(): void {
    this.#heartbeat = setInterval(() => {
      if (this.#unanswered >= STAGE_HEARTBEAT_MISSES) {
        const { id, layers, host, port } = this.ann;
        this.#fail(
          new Error(
            `stage ${id} (layers ${layers.start}-${layers.end}) at ${host}:${port} answered none of ${this.#unanswered} heartbeats in ${
              this.#unanswered * STAGE_HEARTBEAT_MS
            } ms: it hangs`,
          ),
        );
        return;
      }
      this.#unanswered++;
      this.#write({ type: "ping", id: this.#pings++ });
    }, STAGE_HEARTBEAT_MS);
  }

  get stage(): LayerRange {
    return this.ann.layers;
  }

  /** Opens the link and says hello with the ticket; resolves once the stage welcomed it. */
  static async connect(a: StageAnnouncement, ticket: string): Promise<RemoteStage> {
    const conn = await Deno.connect({ hostname: a.host, port: a.port });
    conn.setNoDelay(true);
    const link = new RemoteStage(a, conn);
    const r = await link.#send({ type: "hello", ticket });
    if (r.type !== "welcome" || !same(r.layers, a.layers)) {
      link.dispose();
      throw new Error(`Stage ${a.id} answered the hello with ${JSON.stringify(r).slice(0, 300)}`);
    }
    link.#beat();
    return link;
  }

  async stepStage(plan: StepPlan, input?: Float32Array): Promise<StageOutput> {
    // What the stage reads (lateTokenMask is never sent: the head's engine has no late masks).
    const r = await this.#send({ type: "step", plan, ...(input ? { input } : {}) });
    if (r.type === "rows") return { kind: "rows", rows: r.rows };
    if (r.type === "result") return { kind: "result", result: r.result };
    if (r.type === "error") {
      throw new Error(
        `Stage ${this.ann.id} (layers ${this.ann.layers.start}-${this.ann.layers.end}): ${r.message}`,
      );
    }
    throw new Error(`Stage ${this.ann.id} answered step ${plan.stepId} with a ${r.type}`);
  }

  release(seqId: number): void {
    this.#write({ type: "release", seqId });
  }

  /** Every rank's columns of the rank's current gather. */
  sendGather(parts: Float32Array[]): void {
    this.#write({ type: "gather", parts });
  }

  dispose(): void {
    this.#fail(new Error(`the link to stage ${this.ann.id} was closed by the head`), true);
  }

  #send(msg: unknown): Promise<LinkReply> {
    if (this.#gone) return Promise.reject(this.#gone);
    const reply = new Promise<LinkReply>((resolve, reject) =>
      this.#pending.push({ resolve, reject })
    );
    this.#write(msg);
    return reply;
  }

  #write(msg: unknown): void {
    if (this.#gone) return;
    this.#writer.write(encodeFrame(msg)).catch((e) => this.#lost(e));
  }

  async #read(): Promise<void> {
    const reader = new FrameReader(this.conn, MAX_LINK_FRAME);
    for (let f = await reader.next(); f; f = await reader.next()) {
      const r = parseMessage(LinkReplySchema, decodeFrame(f), `reply of stage ${this.ann.id}`);
      if (r.type === "pong") {
        this.#unanswered = 0;
        continue;
      }
      if (r.type === "gather") {
        if (!this.onGather) {
          throw new Error(`stage ${this.ann.id} sent a gather, but it is no rank`);
        }
        this.onGather(r.cols);
        continue;
      }
      const p = this.#pending.shift();
      if (!p) throw new Error(`stage ${this.ann.id} sent a ${r.type} nobody asked for`);
      p.resolve(r);
    }
    this.#fail(
      new Error(`stage ${this.ann.id} at ${this.ann.host}:${this.ann.port} closed its link`),
    );
  }

  #lost(e: unknown): void {
    const why = e instanceof Error ? e.message : String(e);
    this.#fail(
      new Error(`stage ${this.ann.id} at ${this.ann.host}:${this.ann.port} lost its link: ${why}`),
    );
  }

  #fail(e: Error, byHead = false): void {
    if (this.#gone) return;
    this.#gone = e;
    this.stageGone = !byHead;
    clearInterval(this.#heartbeat);
    this.onLost?.(e);
    for (const p of this.#pending.splice(0)) p.reject(e);
    try {
      this.conn.close();
    } catch { /* closed already */ }
  }
}
