/**
 * The one source of the cluster's defaults: the replicas, the routers, the routing rule, the
 * NATS connection and `deno task cluster`. Each option's doc says what it does; the settings
 * table (lib/cli/settings.ts) shows the ones a user sets.
 */
export const CLUSTER_DEFAULTS = {
  // ── replicas
  /** A replica's heartbeat period; routers drop one silent for staleAfterMs. */
  heartbeatMs: 250,
  /** Prefix-cache hashes one heartbeat carries at most. */
  maxHashes: 4096,
  /** A stream waiting this long for credit is given up: its router is gone. */
  creditTimeoutMs: 30_000,
  /** How long a stopping replica waits for its goodbye to reach the NATS server. */
  goodbyeFlushMs: 2000,
  // ── routers
  /** The routing rule (`--routing`). */
  routing: "prefix",
  /** A replica silent this long leaves the rotation (six heartbeats). */
  staleAfterMs: 1500,
  /** ...and one whose load figures are this old (its main thread hangs). */
  stalledAfterMs: 15_000,
  /** A stream with no frame and no heartbeat listing it for this long is lost. */
  streamTimeoutMs: 1500,
  /** How long a stream that lost its replica waits for another one. */
  failoverWaitMs: 30_000,
  /** A stream with no frame this long is lost even while its replica's heartbeats list it. */
  progressTimeoutMs: 30_000,
  /** Frames a replica may send ahead of the client. */
  window: 64,
  /** How long a router waits at start for a replica to announce itself. */
  replicaWaitMs: 60_000,
  /** How long a replica may take to answer the info request. */
  infoTimeoutMs: 3000,
  /**
   * A router by model's waits: a replica of several models loads the model before it answers
   * the info request, which may take as long as a load.
   */
  modelLoadWaitMs: 120_000,
  /** A model none of whose replicas beat for this long is no longer served. */
  forgetModelAfterMs: 5000,
  /** How long after opening a stream its replica's heartbeats may still omit it. */
  unlistedGraceMs: 5000,
  /** Half-life of the decaying count of requests a router sent each replica. */
  recentHalfLifeMs: 10_000,
  /**
   * How long blocks a router just routed are taken as cached there before a beat lists them,
   * and a replica it sent a model's first request is taken as loading it.
   */
  pendingMs: 30_000,
  // ── the prefix rule (lib/cluster/routing.ts says why these numbers)
  /** Requests a prefix holder may be ahead of the least loaded replica... */
  absSlack: 8,
  /** ...or this fraction of the least loaded one's load, whichever is more. */
  relSlack: 0.5,
  /** A holder whose recent work exceeds the least worked one's by this factor... */
  workBalance: 1.25,
  /** ...plus this many requests is passed over too. */
  workSlack: 2,
  // ── NATS
  /** Largest NATS payload where the server does not say (nats-server's own default). */
  maxPayloadBytes: 1 << 20,
  /** The capped log of what peers send: characters a line, lines a window, the window. */
  peerLogMaxChars: 300,
  peerLogPerWindow: 10,
  peerLogWindowMs: 10_000,
  // ── the shared result cache (JetStream key-value; see docs/cluster.md)
  /** Its bucket; every replica on one NATS server shares it. */
  sharedCacheBucket: "llmserve_results",
  /** How long an entry lives (`--shared-cache-ttl`). */
  sharedCacheTtl: "1h",
  /** The bucket's bound: the oldest entries go first beyond it. */
  sharedCacheBucketBytes: 256 << 20,
  /** The largest entry (sealed) it stores; a larger result is kept in-process only. */
  sharedCacheMaxValueBytes: 512 << 10,
  /** A lookup or store taking longer counts as the store being unreachable. */
  sharedCacheTimeoutMs: 1000,
  /** After the store was unreachable, requests skip it this long before it is tried again. */
  sharedCacheRetryMs: 5000,
  // ── `deno task cluster`
  /** Replicas it starts (`--replicas`). */
  localReplicas: 2,
  /** Port of its nats-server on 127.0.0.1 (`--nats-port`). */
  localNatsPort: 4222,
} as const;
