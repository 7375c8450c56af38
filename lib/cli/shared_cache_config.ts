import type { Config } from "./config.ts";
import { NatsResultStore } from "../cluster/nats_result_store.ts";

/**
 * The result cache's shared level a replica's configuration asks for: on with --nats,
 * --result-cache and --shared-cache-secret; without the secret it stays off, said once (the
 * entries' names and keys come from it, so no default could be safe to share).
 */
export function sharedResultStore(
  c: Config,
  log: (line: string) => void,
): NatsResultStore | undefined {
  if (c.nats === undefined || c.resultCache === 0) return undefined;
  if (c.sharedCacheSecret === undefined) {
    log(
      "shared result cache off: --nats is given without --shared-cache-secret " +
        "(LLMSERVE_SHARED_CACHE_SECRET), so this replica's result cache is its own",
    );
    return undefined;
  }
  return new NatsResultStore({ secret: c.sharedCacheSecret, ttlMs: c.sharedCacheTtl, log });
}
