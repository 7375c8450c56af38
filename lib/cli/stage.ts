import { parseSettings } from "./flag_parser.ts";
import { printInfo } from "./help.ts";
import { STOP_SIGNALS } from "./stop_deadline.ts";
import { whenLauncherGone } from "./parent_watch.ts";
import { resolveModelSource } from "../source/model_source.ts";
import { connectNats } from "../cluster/nats_connection.ts";
import { startStage } from "../cluster/stage_server.ts";
import type { LayerRange } from "../engine/stage_link.ts";

/** "a-b" (validated by the settings row) as a layer range. */
export function parseLayers(text: string): LayerRange {
  const [start, end] = text.split("-").map(Number) as [number, number];
  return { start, end };
}

/** "r/n" (validated by the settings row) as a tensor-parallel rank. */
export function parseTpRank(text: string): { rank: number; size: number } {
  const [rank, size] = text.split("/").map(Number) as [number, number];
  return { rank, size };
}

/** `stage` command: one pipeline stage until SIGTERM or SIGINT (lib/cluster/stage_server.ts). */
export async function stageCommand(argv: string[]): Promise<number> {
  if (printInfo("stage", argv)) return 0;
  const s = parseSettings("stage", argv);
  if (s.nats === undefined) throw new Error("Cannot start a stage: --nats is required");
  if ((s.layers === undefined) === (s.tpRank === undefined)) {
    throw new Error(
      "Cannot start a stage: give one of --layers (a pipeline stage) or --tp-rank (a tensor-parallel rank)",
    );
  }
  const log = (line: string) => console.error(line);
  const { modelPath } = await resolveModelSource(s.model);
  const nc = await connectNats({
    url: s.nats,
    name: `llmserve-stage-${s.layers ?? `tp-${s.tpRank}`}`,
    log,
    ...(s.natsCreds === undefined ? {} : { credsFile: s.natsCreds }),
  });
  const stage = await startStage(nc, {
    modelPath,
    ...(s.layers === undefined ? {} : { layers: parseLayers(s.layers) }),
    ...(s.tpRank === undefined ? {} : { tensorParallel: parseTpRank(s.tpRank) }),
    host: s.stageHost,
    ...(s.threads === undefined ? {} : { threads: s.threads }),
    ...(s.memoryBudget === undefined ? {} : { memoryBudget: s.memoryBudget }),
    ...(s.contextLength === undefined ? {} : { contextLength: s.contextLength }),
    log,
  });
  await new Promise<void>((resolve) => {
    for (const sig of STOP_SIGNALS) Deno.addSignalListener(sig, resolve);
    whenLauncherGone(resolve);
  });
  await stage.close();
  log(`stage ${stage.announcement.id}: stopped`);
  // NATS may already be gone (stopped with the head that started this stage).
  await nc.drain().catch(() => {});
  return 0;
}
