/**
 * `deno task start --pipeline-parallel-size N`: this server is the pipeline's head and runs
 * its first stage; the other stages are `stage` processes it starts itself on this machine
 * (with its own nats-server), or, with --nats, ones already announced there. Layers are split
 * evenly, the first stages taking one more where they do not divide. With
 * --tensor-parallel-size N instead, it is rank 0 of N tensor-parallel ranks, the others
 * `stage --tp-rank r/N` processes, found and started the same way.
 */
import { WasmEngine, type WasmEngineOptions } from "../../kernels/wasm/wasm_engine.ts";
import { stagePlacement } from "../../kernels/wasm/stage_placement.ts";
import type { Engine, KvGeometry } from "../engine/engine.ts";
import { tpShard } from "../../kernels/wasm/tp_shard.ts";
import { tpPlacement } from "../../kernels/wasm/tp_placement.ts";
import { TensorParallelEngine } from "../engine/tensor_parallel_engine.ts";
import { HubGather } from "../cluster/tp_link.ts";
import { PipelineEngine } from "../engine/pipeline_engine.ts";
import type { LayerRange } from "../engine/stage_link.ts";
import { readGgufHeader } from "../model/gguf.ts";
import type { PlaceTensors } from "../model/gguf.ts";
import type { Model } from "../model/weights.ts";
import { resolveModelSource } from "../source/model_source.ts";
import { modelIdentity } from "../cluster/model_identity.ts";
import { connectNats, type NatsConnection } from "../cluster/nats_connection.ts";
import { attachStages, type RemoteStage, type StageWanted } from "../cluster/stage_client.ts";
import { type RequestLinks, stageObserver } from "./stage_observer.ts";
import { budgetProblem } from "../cluster/stage_server.ts";
import type { StepLimits } from "../compose/engine_factory.ts";
import type { Config } from "./config.ts";
import { type LocalNats, startLocalNats } from "./local_nats.ts";
import { PARENT_PIPE_ENV } from "./parent_watch.ts";
import type { ServiceMetrics } from "../http/service_metrics.ts";

/** How long the head waits for its stages to load and announce themselves. */
export const STAGE_WAIT_MS = 120_000;

/** `layers` split into `n` contiguous ranges, as even as they go (the first ones longer). */
export function evenRanges(layers: number, n: number): LayerRange[] {
  if (n > layers) {
    throw new Error(`Cannot split ${layers} layers into ${n} pipeline stages: at most ${layers}`);
  }
  const ranges: LayerRange[] = [];
  let start = 0;
  for (let i = 0; i < n; i++) {
    const end = start + Math.floor(layers / n) + (i < layers % n ? 1 : 0);
    ranges.push({ start, end });
    start = end;
  }
  return ranges;
}

export interface PipelineHead {
  readonly ranges: readonly LayerRange[];
  /** Reads only the first stage's tensors, or rank 0's rows of each. */
  readonly placeTensors: PlaceTensors;
  /**
   * The first stage (or rank 0) here, the others attached: a PipelineEngine or a
   * TensorParallelEngine (each executor restart too).
   */
  build(
    model: Model,
    kv: KvGeometry,
    limits: StepLimits,
  ): Promise<{ engine: Engine; description: string }>;
  /**
   * Counts each stage's time, bytes, queue depth and bubble into `metrics`
   * (llm_pipeline_stage_*), every build's, and traces each stage step, linked by `links`.
   */
  observeInto(metrics: ServiceMetrics, links: () => RequestLinks | undefined): void;
  /** Stops the stages and the nats-server it started. */
  close(): Promise<void>;
}

/** The file the stages read, its layer count, and the identity head and stages match by. */
async function modelLayout(c: Config) {
  const { modelPath } = await resolveModelSource(c.model, { modelsDir: c.modelsDir });
  const header = await readGgufHeader(modelPath);
  const arch = header.metadata.get("general.architecture")?.value;
  const layers = Number(header.metadata.get(`${arch}.block_count`)?.value);
  // Stages and head match by the file and the context it is opened with (before the head's KV
  // plan shortens its own, which it then tells the stages in the attach).
  const context = c.contextLength ?? Number(header.metadata.get(`${arch}.context_length`)?.value);
  return { modelPath, layers, identity: await modelIdentity(modelPath, context) };
}

/**
 * The stage processes of this machine, with their own nats-server: started at once, started
 * again where one has exited when the engine is built again (an executor restart), and stopped
 * with the server (or with this process, should its start fail later).
 */
class LocalStages {
  readonly #children: (Deno.ChildProcess | undefined)[];
  readonly #exited = new Set<number>();
  readonly #onExit = () => this.#signal();

  constructor(
    readonly nats: LocalNats,
    readonly modelPath: string,
    /** Per process, what it serves (`--layers a-b` or `--tp-rank r/n`); the first is this one. */
    readonly roles: readonly string[][],
    readonly c: Config,
  ) {
    this.#children = roles.map((_, i) => (i === 0 ? undefined : this.#spawn(i)));
    globalThis.addEventListener("unload", this.#onExit);
  }

  #spawn(i: number): Deno.ChildProcess {
    const child = spawnStage(this.nats.url, this.modelPath, this.roles[i]!, this.c);
    this.#exited.delete(i);
    child.status.then(() => this.#exited.add(i));
    return child;
  }

  /** Ends the process of stage `i` (one that hangs: SIGKILL also ends a stopped one). */
  async end(i: number): Promise<void> {
    const ch = this.#children[i];
    try {
      ch?.kill("SIGKILL");
    } catch { /* gone */ }
    await ch?.status;
  }

  /** Starts again each stage whose process has exited. */
  respawnExited(): void {
    for (const i of [...this.#exited]) this.#children[i] = this.#spawn(i);
  }

  #signal(): void {
    this.#signalStages();
    this.nats.kill();
  }

  #signalStages(): void {
    for (const ch of this.#children) {
      try {
        ch?.kill("SIGTERM");
      } catch { /* gone */ }
    }
  }

  /** The stages first (they leave NATS on their way out), then nats-server. */
  async stop(): Promise<void> {
    globalThis.removeEventListener("unload", this.#onExit);
    this.#signalStages();
    for (const ch of this.#children) {
      await ch?.status;
      await ch?.stdin.close().catch(() => {});
    }
    await this.nats.stop();
  }
}

/** Starts what the head needs: the stages' ranges, NATS, and the stage processes. */
export async function startPipelineHead(
  c: Config,
  log: (line: string) => void,
): Promise<PipelineHead> {
  const tp = c.tensorParallelSize;
  const what = tp > 1
    ? `--tensor-parallel-size ${tp}: tensor-parallel ranks`
    : `--pipeline-parallel-size ${c.pipelineParallelSize}: pipeline stages`;
  if (tp > 1 && c.pipelineParallelSize > 1) {
    throw new Error(
      `Cannot run --tensor-parallel-size ${tp} with --pipeline-parallel-size ${c.pipelineParallelSize}: TP × PP is not built yet; use one of them`,
    );
  }
  if (c.backend !== "cpu" && c.backend !== "auto") {
    throw new Error(
      `Cannot run ${what} run the CPU engine; pass --backend cpu (received --backend ${c.backend})`,
    );
  }
  const { modelPath, layers, identity } = await modelLayout(c);
  const ranges = tp > 1 ? [{ start: 0, end: layers }] : evenRanges(layers, c.pipelineParallelSize);
  const roles = tp > 1
    ? Array.from({ length: tp }, (_, i) => ["--tp-rank", `${i}/${tp}`])
    : ranges.map((r) => ["--layers", `${r.start}-${r.end}`]);
  const local = c.nats === undefined
    ? new LocalStages(await startLocalNats(), modelPath, roles, c)
    : undefined;
  const nc: NatsConnection = await connectNats({
    url: c.nats ?? local!.nats.url,
    name: "llmserve-pipeline-head",
    log,
    ...(c.natsCreds === undefined ? {} : { credsFile: c.natsCreds }),
  });
  log(
    tp > 1
      ? `tensor parallelism: ${tp} ranks, this one rank 0${local ? " (ranks started here)" : ""}`
      : `pipeline: ${ranges.length} stages, layers ${
        ranges.map((r) => `${r.start}-${r.end}`).join(", ")
      }${local ? " (stages started here)" : ""}`,
  );
  let observe: PipelineEngine["onStage"];
  let remote: RemoteStage[] = [];
  return {
    ranges,
    placeTensors: tp > 1 ? tpPlacement(0, tp) : stagePlacement(ranges[0]!, modelPath),
    build: async (model, kv, limits) => {
      // A stage (or rank) whose link failed is ended and awaited here, so that it is started
      // again below: one that hung is still running, and the exit of one that died may not
      // have been seen yet (its link's close can come first, and the step failed on that).
      for (const [i, link] of remote.entries()) if (link.stageGone) await local?.end(i + 1);
      remote = []; // handled: a build that fails below must not end their successors
      local?.respawnExited();
      const o = { model, kv, limits, ranges, identity };
      if (tp > 1) {
        const built = await buildTensorParallel(c, nc, o);
        remote = built.remote;
        return { engine: built.engine, description: built.description };
      }
      const built = await buildPipeline(c, nc, o);
      built.engine.onStage = observe;
      remote = built.remote;
      return { engine: built.engine, description: built.description };
    },
    observeInto: (metrics, links) => {
      observe = stageObserver(metrics, ranges.length, links);
    },
    close: async () => {
      await nc.close();
      await local?.stop();
    },
  };
}

/** What each build of the head's engine (pipeline or tensor-parallel) starts from. */
interface HeadBuild {
  readonly model: Model;
  readonly kv: KvGeometry;
  readonly limits: StepLimits;
  readonly ranges: readonly LayerRange[];
  /** The model's identity the remote stages must hold. */
  readonly identity: string;
}

/**
 * The head's own part of the engine (its pipeline stage or tensor-parallel rank 0, `role`) and
 * the remote parts `wanted` names, made one engine by `join`. The head's part keeps to
 * --memory-budget too, where one was given, and is disposed of when anything after it fails.
 */
async function headWithRemote<T>(
  c: Config,
  nc: NatsConnection,
  o: HeadBuild,
  head: {
    readonly opts: WasmEngineOptions;
    readonly role: string;
    readonly wanted: Pick<StageWanted, "ranges" | "tpSize">;
  },
  join: (first: WasmEngine, remote: RemoteStage[]) => T,
): Promise<T & { remote: RemoteStage[] }> {
  const { model, kv, limits } = o;
  const first = await WasmEngine.create(model.config, model.weights, kv, {
    ...limits,
    ...head.opts,
    ...(c.threads === undefined ? {} : { threads: c.threads }),
  });
  try {
    const over = budgetProblem(first, c.memoryBudget);
    if (over !== undefined) throw new Error(`Cannot run the head's ${head.role}: ${over}`);
    const remote = await attachStages(nc, {
      model: o.identity,
      contextLength: model.config.contextLength,
      ...head.wanted,
      kv,
      limits,
      timeoutMs: STAGE_WAIT_MS,
    });
    return { ...join(first, remote), remote };
  } catch (e) {
    first.dispose();
    throw e;
  }
}

/** The head's stage here and the others attached over `nc`, as one PipelineEngine. */
function buildPipeline(
  c: Config,
  nc: NatsConnection,
  o: HeadBuild,
): Promise<{ engine: PipelineEngine; description: string; remote: RemoteStage[] }> {
  const { model, kv, limits, ranges } = o;
  const groups = c.pipelineMicroBatches ?? ranges.length;
  const head = {
    opts: { layers: ranges[0]! },
    role: "pipeline stage",
    wanted: { ranges: ranges.slice(1) },
  };
  return headWithRemote(c, nc, o, head, (first, remote) => ({
    engine: new PipelineEngine(model.config, kv, [first, ...remote], limits, groups),
    description: `pipeline of ${ranges.length} cpu stages (WebAssembly, ${first.threads} ` +
      `threads here, ${groups} micro-batches)`,
  }));
}

/**
 * Rank 0 here (it gathers as the hub, lib/cluster/tp_link.ts) and ranks 1.. attached over
 * `nc`, as one TensorParallelEngine.
 */
function buildTensorParallel(
  c: Config,
  nc: NatsConnection,
  o: HeadBuild,
): Promise<{ engine: Engine; description: string; remote: RemoteStage[] }> {
  const { model, kv, limits } = o;
  const size = c.tensorParallelSize, hub = new HubGather();
  const head = {
    opts: { tensorParallel: { shard: tpShard(model.config, 0, size), exchange: hub } },
    role: "tensor-parallel rank",
    wanted: { ranges: o.ranges, tpSize: size },
  };
  return headWithRemote(c, nc, o, head, (first, remote) => {
    hub.attach(remote);
    const engine = new TensorParallelEngine(
      model.config,
      kv,
      [first, ...remote],
      limits,
      (e) => hub.fail(e),
    );
    const description =
      `tensor parallelism over ${size} cpu ranks (WebAssembly, ${first.threads} threads here)`;
    return { engine, description };
  });
}

/** A stage process of this machine; the NATS URL (with its password) goes in its environment. */
function spawnStage(url: string, modelPath: string, role: string[], c: Config): Deno.ChildProcess {
  const main = new URL("../../main.ts", import.meta.url).pathname;
  const args = ["run", "--allow-all", main, "stage", "--model", modelPath, ...role];
  if (c.threads !== undefined) args.push("--threads", String(c.threads));
  if (c.contextLength !== undefined) args.push("--context-length", String(c.contextLength));
  if (c.memoryBudget !== undefined) args.push("--memory-budget", String(c.memoryBudget));
  return new Deno.Command(Deno.execPath(), {
    args,
    // Its stdin is a pipe from here: should this process die without a word, it stops too.
    env: { LLMSERVE_NATS: url, [PARENT_PIPE_ENV]: "1" },
    stdin: "piped",
    stdout: "null",
    stderr: "inherit",
  }).spawn();
}
