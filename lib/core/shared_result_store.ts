import type { StoredResult } from "./result_cache.ts";

/** What a shared result store counts, for /metrics. */
export interface SharedResultStoreStats {
  /** Lookups it answered. */
  readonly hits: number;
  /** Lookups it did not hold (or held for another key: it could not be decrypted). */
  readonly misses: number;
  /** Lookups and stores that failed because the store could not be reached (or refused). */
  readonly unavailable: number;
  /** Results not stored because they exceed the store's largest value. */
  readonly tooLarge: number;
  /** Results stored. */
  readonly stored: number;
}

/**
 * A result cache shared by several servers (the replicas behind a router), consulted after
 * the in-process ResultCache misses. `key` is resultCacheKey()'s (it already names the scope);
 * `scope` is the request's cache scope ("" without one), which the store may use to keep one
 * tenant's entries unreadable with another's. Neither method throws: a store that cannot be
 * reached answers a miss and counts it, so a request is computed as if the cache missed.
 */
export interface SharedResultStore {
  get(key: string, scope: string): Promise<StoredResult | undefined>;
  set(key: string, scope: string, result: StoredResult): Promise<void>;
  stats(): SharedResultStoreStats;
}
