/**
 * `deno task start --pipeline-parallel-size N`: this server is the pipeline's head and runs
 * its first stage; the other stages are `stage` processes it starts itself on this machine
 * (with its own nats-server), or, with --nats, ones already announced there. Layers are split
 * evenly, the first stages taking one more where they do not divide.
 */
import { WasmEngine } from "../../kernels/wasm/wasm_engine.ts";
import { stagePlacement } from "../../kernels/wasm/stage_placement.ts";
import type { KvGeometry } from "../engine/engine.ts";
import { PipelineEngine } from "../engine/pipeline_engine.ts";
import type { LayerRange } from "../engine/stage_link.ts";
import { readGgufHeader } from "../model/gguf.ts";
import type { PlaceTensors } from "../model/gguf.ts";
import type { Model } from "../model/weights.ts";
import { resolveModelSource } from "../source/model_source.ts";
import { modelIdentity } from "../cluster/model_identity.ts";
import { connectNats, type NatsConnection } from "../cluster/nats_connection.ts";
import { attachStages } from "../cluster/stage_client.ts";
import { budgetProblem } from "../cluster/stage_server.ts";
import type { StepLimits } from "../compose/engine_factory.ts";
import type { Config } from "./config.ts";
import { type LocalNats, startLocalNats } from "./local_nats.ts";
import { PARENT_PIPE_ENV } from "./parent_watch.ts";

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
  /** Reads only the first stage's tensors. */
  readonly placeTensors: PlaceTensors;
  /** The first stage here, the others attached: a PipelineEngine (each executor restart too). */
  build(
    model: Model,
    kv: KvGeometry,
    limits: StepLimits,
  ): Promise<{ engine: PipelineEngine; description: string }>;
  /** Stops the stages and the nats-server it started. */
  close(): Promise<void>;
}

/** Starts what the head needs: the stages' ranges, NATS, and the stage processes. */
export async function startPipelineHead(
  c: Config,
  log: (line: string) => void,
): Promise<PipelineHead> {
  if (c.backend !== "cpu") {
    throw new Error(
      `Cannot run --pipeline-parallel-size ${c.pipelineParallelSize}: pipeline stages run the CPU engine; pass --backend cpu (received --backend ${c.backend})`,
    );
  }
  const { modelPath } = await resolveModelSource(c.model, { modelsDir: c.modelsDir });
  const header = await readGgufHeader(modelPath);
  const arch = header.metadata.get("general.architecture")?.value;
  const layers = Number(header.metadata.get(`${arch}.block_count`)?.value);
  // Stages and head match by the file and the context it is opened with (before the head's KV
  // plan shortens its own, which it then tells the stages in the attach).
  const identity = await modelIdentity(
    modelPath,
    c.contextLength ?? Number(header.metadata.get(`${arch}.context_length`)?.value),
  );
  const ranges = evenRanges(layers, c.pipelineParallelSize);
  const local: LocalNats | undefined = c.nats === undefined ? await startLocalNats() : undefined;
  const url = c.nats ?? local!.url;
  const children = local ? ranges.slice(1).map((r) => spawnStage(url, modelPath, r, c)) : [];
  // A start that fails later (Deno.exit on its error) still stops what was started here.
  const onExit = () => {
    for (const ch of children) {
      try {
        ch.kill("SIGTERM");
      } catch { /* gone */ }
    }
    local?.kill();
  };
  globalThis.addEventListener("unload", onExit);
  const nc: NatsConnection = await connectNats({
    url,
    name: "llmserve-pipeline-head",
    log,
    ...(c.natsCreds === undefined ? {} : { credsFile: c.natsCreds }),
  });
  log(
    `pipeline: ${ranges.length} stages, layers ${
      ranges.map((r) => `${r.start}-${r.end}`).join(", ")
    }${local ? " (stages started here)" : ""}`,
  );
  return {
    ranges,
    placeTensors: stagePlacement(ranges[0]!, modelPath),
    build: async (model, kv, limits) => {
      const first = await WasmEngine.create(model.config, model.weights, kv, {
        ...limits,
        layers: ranges[0]!,
        ...(c.threads === undefined ? {} : { threads: c.threads }),
      });
      try {
        // The head's stage keeps to --memory-budget too, where one was given.
        const over = budgetProblem(first, c.memoryBudget);
        if (over !== undefined) throw new Error(`Cannot run the head's pipeline stage: ${over}`);
        const remote = await attachStages(nc, {
          model: identity,
          contextLength: model.config.contextLength,
          ranges: ranges.slice(1),
          kv,
          limits,
          timeoutMs: STAGE_WAIT_MS,
        });
        const groups = c.pipelineMicroBatches ?? ranges.length;
        const engine = new PipelineEngine(model.config, kv, [first, ...remote], limits, groups);
        return {
          engine,
          description:
            `pipeline of ${ranges.length} cpu stages (WebAssembly, ${first.threads} threads here)`,
        };
      } catch (e) {
        first.dispose();
        throw e;
      }
    },
    close: async () => {
      globalThis.removeEventListener("unload", onExit);
      await nc.close();
      await Promise.all(children.map(async (ch) => {
        try {
          ch.kill("SIGTERM");
        } catch { /* gone */ }
        await ch.status;
        await ch.stdin.close().catch(() => {});
      }));
      await local?.stop();
    },
  };
}

/** A stage process of this machine; the NATS URL (with its password) goes in its environment. */
function spawnStage(url: string, modelPath: string, r: LayerRange, c: Config): Deno.ChildProcess {
  const main = new URL("../../main.ts", import.meta.url).pathname;
  const args = [
    "run",
    "--allow-all",
    main,
    "stage",
    "--model",
    modelPath,
    "--layers",
    `${r.start}-${r.end}`,
  ];
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
