/**
 * A pipeline stage process: the CPU engine of one layer range of a GGUF, loaded with only that
 * range's tensors, announced over NATS and served to the head that attaches over a direct TCP
 * link (frame_stream.ts), which NATS only brokers: the stage's announcement says where the
 * link listens, the attach request (over the authenticated NATS connection) gives the head a
 * one-time ticket, and the link's first frame must carry it.
 */
import { WasmEngine } from "../../kernels/wasm/wasm_engine.ts";
import { stagePlacement } from "../../kernels/wasm/stage_placement.ts";
import { tpShard } from "../../kernels/wasm/tp_shard.ts";
import { tpPlacement } from "../../kernels/wasm/tp_placement.ts";
import { RankGather } from "./tp_link.ts";
import type { LayerRange } from "../engine/stage_link.ts";
import { loadModel } from "../model/load_model.ts";
import type { Model } from "../model/weights.ts";
import { decodeFrame, encodeFrame } from "./binary_frame.ts";
import { FrameReader, FrameWriter } from "./frame_stream.ts";
import { modelIdentity } from "./model_identity.ts";
import { type BusConnection, guarded } from "./nats_connection.ts";
import {
  type LinkReply,
  LinkRequestSchema,
  parseMessage,
  type StageAnnouncement,
  type StageAttach,
  type StageAttachReply,
  StageAttachSchema,
} from "./stage_messages.ts";
import { randomId, subjects } from "./subjects.ts";

/** The largest frame a link takes: a step's plan with its masks and a prefill's rows. */
export const MAX_LINK_FRAME = 512 * 2 ** 20;
/** How often a stage announces itself. */
export const STAGE_ANNOUNCE_MS = 1000;

export interface StageOptions {
  readonly modelPath: string;
  /** The layers of a pipeline stage; absent for a tensor-parallel rank (it runs them all). */
  readonly layers?: LayerRange;
  /**
   * Serve as rank `rank` (1..size-1) of a tensor-parallel group whose rank 0 is the head: all
   * layers, the rank's rows of each (read by offset: tp_placement.ts).
   */
  readonly tensorParallel?: { readonly rank: number; readonly size: number };
  readonly contextLength?: number;
  readonly threads?: number;
  /** Where the link listens (default 127.0.0.1, port 0: any free one). */
  readonly host?: string;
  readonly port?: number;
  readonly id?: string;
  /** The most its engine may hold, weights and KV cache (--memory-budget); default no limit. */
  readonly memoryBudget?: number;
  readonly log?: (line: string) => void;
}

/**
 * Why an engine's weights and KV cache exceed `budget` bytes, naming both and the layers; undefined
 * when they fit or there is no budget.
 */
export function budgetProblem(
  engine: WasmEngine,
  budget: number | undefined,
): string | undefined {
  const { weights, kvCache } = engine.memory;
  if (budget === undefined || weights + kvCache <= budget) return undefined;
  const { start, end } = engine.stage;
  return `layers ${start}-${end} need ${
    weights + kvCache
  } bytes (weights ${weights}, KV cache ${kvCache}), more than the --memory-budget of ${budget}`;
}

/** A running stage: its announcement, and close(). */
export interface RunningStage {
  readonly announcement: StageAnnouncement;
  close(): Promise<void>;
}

/** Loads the stage's layers, listens for its link and announces it on `nc`. */
export async function startStage(nc: BusConnection, o: StageOptions): Promise<RunningStage> {
  const log = o.log ?? (() => {});
  if ((o.layers === undefined) === (o.tensorParallel === undefined)) {
    throw new Error("Cannot start a stage: expected a layer range or a tensor-parallel rank");
  }
  const model = await loadModel(o.modelPath, {
    ...(o.contextLength === undefined ? {} : { contextLength: o.contextLength }),
    placeTensors: o.layers
      ? stagePlacement(o.layers, o.modelPath)
      : tpPlacement(o.tensorParallel!.rank, o.tensorParallel!.size),
  });
  const layers = o.layers ?? { start: 0, end: model.config.nLayers };
  if (o.tensorParallel) {
    const { rank, size } = o.tensorParallel;
    tpShard(model.config, rank, size); // refuses a size the model's heads cannot be split into
    if (rank < 1) {
      throw new Error(
        `Cannot start tensor-parallel rank ${rank} of ${size} as a stage: rank 0 is the head; expected 1..${
          size - 1
        }`,
      );
    }
  }
  const listener = Deno.listen({ hostname: o.host ?? "127.0.0.1", port: o.port ?? 0 });
  const announcement: StageAnnouncement = {
    type: "stage",
    id: o.id ?? randomId("stage"),
    model: await modelIdentity(o.modelPath, model.config.contextLength),
    layers: { start: layers.start, end: layers.end },
    nLayers: model.config.nLayers,
    ...(o.tensorParallel ? { tp: { ...o.tensorParallel } } : {}),
    host: o.host ?? "127.0.0.1",
    port: (listener.addr as Deno.NetAddr).port,
  };
  const state = new StageState(model, announcement, o.threads, o.memoryBudget, log);
  const sub = nc.subscribe(subjects.stage(announcement.id), {
    callback: guarded((msg) => {
      state.attach(msg.data).then((r) => msg.respond(new TextEncoder().encode(JSON.stringify(r))));
    }, (e) => log(`stage: attach handler failed: ${e}`)),
  });
  const announce = () =>
    nc.publish(subjects.stages, new TextEncoder().encode(JSON.stringify(announcement)));
  announce();
  const timer = setInterval(announce, STAGE_ANNOUNCE_MS);
  const accepting = (async () => {
    for await (const conn of listener) state.serve(conn).catch((e) => log(`stage link: ${e}`));
  })().catch(() => {});
  log(
    `stage ${announcement.id}: ${
      o.tensorParallel
        ? `tensor-parallel rank ${o.tensorParallel.rank} of ${o.tensorParallel.size}, `
        : ""
    }layers ${layers.start}-${layers.end} of ${model.config.nLayers} of ${o.modelPath}, link on ${announcement.host}:${announcement.port}`,
  );
  return {
    announcement,
    close: async () => {
      clearInterval(timer);
      sub.unsubscribe();
      listener.close();
      await accepting;
      state.close();
    },
  };
}

/** The engine a head attached, its ticket, and the links served on it. */
class StageState {
  #engine: WasmEngine | undefined;
  #ticket: string | undefined;
  /** A tensor-parallel rank's gathers, bound to the link of the head that attached. */
  #gather: RankGather | undefined;
  #links = new Set<Deno.TcpConn>();

  constructor(
    readonly model: Model,
    readonly ann: StageAnnouncement,
    readonly threads: number | undefined,
    readonly budget: number | undefined,
    readonly log: (line: string) => void,
  ) {}

  /** An attach request: a new engine for the head's geometry, replacing any earlier one. */
  async attach(data: Uint8Array): Promise<StageAttachReply> {
    let req: StageAttach;
    try {
      req = parseMessage(
        StageAttachSchema,
        JSON.parse(new TextDecoder().decode(data)),
        "attach request",
      );
    } catch (e) {
      return { type: "refused", message: (e as Error).message };
    }
    const { ann } = this;
    const mismatch = this.#mismatch(req);
    if (mismatch !== undefined) return { type: "refused", message: `stage ${ann.id} ${mismatch}` };
    this.close();
    const config = { ...this.model.config, contextLength: req.contextLength };
    const tp = ann.tp;
    this.#gather = tp ? new RankGather(tp.rank, tp.size) : undefined;
    try {
      this.#engine = await WasmEngine.create(config, this.model.weights, req.kv, {
        ...(tp
          ? {
            tensorParallel: { shard: tpShard(config, tp.rank, tp.size), exchange: this.#gather! },
          }
          : { layers: ann.layers }),
        maxBatchTokens: req.limits.maxBatchTokens,
        maxSeqs: req.limits.maxSeqs,
        ...(this.threads === undefined ? {} : { threads: this.threads }),
      });
    } catch (e) {
      return {
        type: "refused",
        message: `stage ${ann.id} cannot build its engine: ${(e as Error).message}`,
      };
    }
    const over = budgetProblem(this.#engine, this.budget);
    if (over !== undefined) {
      this.close();
      return { type: "refused", message: `stage ${ann.id}: ${over}` };
    }
    this.#ticket = crypto.randomUUID();
    this.log(`stage ${ann.id}: attached (${req.kv.numBlocks} KV blocks of ${req.kv.blockSize})`);
    return { type: "attached", ticket: this.#ticket };
  }

  /** What about `req` this stage cannot serve: another model, other layers, a longer context. */
  #mismatch(req: StageAttach): string | undefined {
    const { ann } = this;
    if (req.model !== ann.model) {
      return `serves model ${ann.model}, the head asked for ${req.model}`;
    }
    if (req.layers.start !== ann.layers.start || req.layers.end !== ann.layers.end) {
      return `runs layers ${ann.layers.start}-${ann.layers.end}, the head asked for ${req.layers.start}-${req.layers.end}`;
    }
    const tpOf = (t: { rank: number; size: number } | undefined) =>
      t ? `tensor-parallel rank ${t.rank} of ${t.size}` : "no tensor-parallel rank";
    if (tpOf(req.tp) !== tpOf(ann.tp)) {
      return `is ${tpOf(ann.tp)}, the head asked for ${tpOf(req.tp)}`;
    }
    const ctx = this.model.config.contextLength;
    if (req.contextLength > ctx) {
      return `serves a context of ${ctx}, the head asked for ${req.contextLength}`;
    }
    return undefined;
  }

  /** Serves one link: a hello with the ticket, then steps and releases, answered in order. */
  async serve(conn: Deno.TcpConn): Promise<void> {
    conn.setNoDelay(true);
    this.#links.add(conn);
    const reader = new FrameReader(conn, MAX_LINK_FRAME);
    // One writer keeps frames whole; steps are answered in request order (`answers`), pongs
    // at once, a step's gathers while it runs.
    const writer = new FrameWriter(conn);
    const send = (r: LinkReply) => writer.write(encodeFrame(r)).catch(() => {});
    let answers = Promise.resolve();
    const reply = (r: LinkReply | Promise<LinkReply>) => {
      answers = answers.then(async () => send(await r)).catch(() => {});
    };
    let gather: RankGather | undefined;
    try {
      let engine: WasmEngine | undefined;
      for (let frame = await reader.next(); frame; frame = await reader.next()) {
        let req;
        try {
          req = parseMessage(LinkRequestSchema, decodeFrame(frame), "link message");
        } catch (e) {
          reply({ type: "error", message: `stage ${this.ann.id}: ${(e as Error).message}` });
          continue;
        }
        if (req.type === "ping") {
          send({ type: "pong", id: req.id });
        } else if (req.type === "hello") {
          if (this.#ticket === undefined || req.ticket !== this.#ticket) {
            reply({
              type: "error",
              message:
                `stage ${this.ann.id}: the hello's ticket is not the one its last attach gave`,
            });
            continue;
          }
          this.#ticket = undefined; // one link per attach
          engine = this.#engine;
          gather = this.#gather;
          // Its columns may view shared WebAssembly memory, which LinkReply's type does not name.
          gather?.bind((cols) =>
            writer.write(encodeFrame({ type: "gather", cols })).catch(() => {})
          );
          reply({ type: "welcome", layers: this.ann.layers });
        } else if (!engine) {
          reply({
            type: "error",
            message: `stage ${this.ann.id}: a ${req.type} before a hello with a valid ticket`,
          });
        } else if (req.type === "release") {
          engine.release(req.seqId);
        } else if (req.type === "gather") {
          try {
            if (!gather) throw new Error("a gather, but it is no tensor-parallel rank");
            gather.deliver(req.parts);
          } catch (e) {
            reply({ type: "error", message: `stage ${this.ann.id}: ${(e as Error).message}` });
          }
        } else {
          reply(stepReply(engine, req.plan, req.input));
        }
      }
    } finally {
      gather?.fail(new Error(`stage ${this.ann.id}: the head's link closed during a gather`));
      await answers;
      await writer.idle();
      // Closed already where close() ended every link.
      if (this.#links.delete(conn)) conn.close();
    }
  }

  close(): void {
    for (const c of this.#links) c.close();
    this.#links.clear();
    this.#engine?.dispose();
    this.#engine = undefined;
  }
}

/** The stage's answer to one step: its rows, its result, or the error that names the step. */
async function stepReply(
  engine: WasmEngine,
  plan: Parameters<WasmEngine["stepStage"]>[0],
  input: Float32Array | undefined,
): Promise<LinkReply> {
  try {
    const out = await engine.stepStage(plan, input);
    return out.kind === "rows"
      ? { type: "rows", stepId: plan.stepId, rows: out.rows as Float32Array<ArrayBuffer> }
      : { type: "result", result: out.result as Extract<LinkReply, { type: "result" }>["result"] };
  } catch (e) {
    return { type: "error", stepId: plan.stepId, message: (e as Error).message };
  }
}
