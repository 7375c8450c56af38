import { BatchQueue } from "../batch/batch_queue.ts";
import { resolveDataDir } from "../batch/data_dir.ts";
import type { Config } from "./config.ts";

/** The batch queue a server's settings ask for (one model or several), and its data dir. */
export function batchQueueFor(
  config: Config,
  log: (line: string) => void,
): { batches: BatchQueue; dataDir: string } {
  const dataDir = resolveDataDir(config.dataDir, (n) => Deno.env.get(n));
  const batches = new BatchQueue({
    dataDir,
    maxInFlight: config.batchConcurrency,
    maxFileBytes: config.batchMaxFileSize,
    maxLines: config.batchMaxLines,
    maxActive: config.batchMaxActive,
    maxUploads: config.batchMaxUploads,
    maxUploadsPerKey: config.batchMaxUploadsPerKey,
    maxStorageBytes: config.batchMaxStorage,
    maxFiles: config.batchMaxFiles,
    retentionMs: config.batchRetention,
    log,
  });
  return { batches, dataDir };
}
