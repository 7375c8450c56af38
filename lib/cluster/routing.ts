/**
 * The routing rule, as a pure function of what the router knows about its replicas.
 *
 * - least-loaded: the fewest running + waiting requests; ties go to the replica this router
 *   sent the fewest requests to, then by id.
 * - prefix: the replica whose prefix-cache summary holds the longest run of the prompt's
 *   leading blocks, unless it is much busier than the least loaded one (more than
 *   max(absSlack, relSlack x its load) requests ahead), in which case least-loaded decides.
 *   This is SGLang's cache-aware rule (longest prefix match, with a load-imbalance escape
 *   hatch) rather than Dynamo's cost function (overlap blocks against KV load), because the
 *   only cost that matters here is recomputing the prefix, and a replica's queue is what
 *   makes it "busier"; SGLang's global imbalance check is made per candidate instead. A holder
 *   whose recent share of work is well above the least worked replica's is passed over as
 *   well, so a popular prefix spreads to a second replica. A prompt nobody holds (or whose
 *   holders are passed over) goes to the least loaded replica, ties to the least recent work
 *   and then the smallest cache (SGLang sends it to the smallest tree).
 * - round-robin: for comparison (benchmarks and tests).
 *
 * Full replicas (running + waiting at their limits) never get work; when all are full the
 * answer is "overloaded". Where replicas serve several models, only those with the model
 * loaded (or loading) are considered while one of them has room; else every one serving it.
 */

import { CLUSTER_DEFAULTS } from "./cluster_defaults.ts";

/** Every routing rule, as `--routing` takes it. */
export const ROUTING_POLICIES = ["prefix", "least-loaded", "round-robin"] as const;

export type RoutingPolicy = typeof ROUTING_POLICIES[number];

export interface Candidate {
  readonly id: string;
  /** Requests running or waiting there. */
  readonly load: number;
  /** Load at which it refuses more (maxRunning + maxWaiting). */
  readonly capacity: number;
  /** Requests this router has sent it so far (tie-break that spreads new work). */
  readonly routed: number;
  /** Requests this router sent it recently (decaying count, half-life 10 s): its share of work. */
  readonly recent: number;
  /** Leading prompt blocks it holds (0 when unknown). */
  readonly matchedBlocks: number;
  /** Size of its prefix-cache summary: among equally loaded ones, a new prefix goes to the smallest. */
  readonly cachedBlocks: number;
  /**
   * Whether it has the model loaded (or loading): replicas that do are preferred over ones that
   * would load it first, whatever the policy (default true: a replica of one model has it).
   */
  readonly loaded?: boolean;
}

export type RoutingChoice =
  | {
    readonly kind: "replica";
    readonly id: string;
    readonly reason: "prefix" | "least_loaded" | "round_robin";
    readonly matchedBlocks: number;
  }
  | { readonly kind: "overloaded" }
  | { readonly kind: "none" };

export interface RoutingOptions {
  readonly policy: RoutingPolicy;
  /**
   * Requests a prefix holder may be ahead of the least loaded replica (default 8). SGLang's
   * defaults are looser (32 requests, x1.0001); a CPU replica runs a few dozen at most, and a
   * cached request costs a fraction of an uncached one, so queueing behind the holder pays.
   */
  readonly absSlack?: number;
  /** ...or this fraction of the least loaded one's load, whichever is more (default 0.5). */
  readonly relSlack?: number;
  /**
   * A prefix holder whose recent work exceeds the least worked replica's by this factor (plus
   * workSlack requests) is passed over too (default 1.25 and 2): a popular prefix then spreads
   * to a second replica instead of piling up on one (SGLang's balance thresholds, applied to
   * work done rather than to queues).
   */
  readonly workBalance?: number;
  readonly workSlack?: number;
  /** Round-robin position (the caller increments it). */
  readonly turn?: number;
}

function byId(a: Candidate, b: Candidate): number {
  return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}

function byLoad(a: Candidate, b: Candidate): number {
  return a.load - b.load || a.recent - b.recent || a.routed - b.routed || byId(a, b);
}

/** SGLang sends a prompt nobody has cached to the smallest cache; load still comes first. */
function byLoadThenCache(a: Candidate, b: Candidate): number {
  return a.load - b.load || a.recent - b.recent || a.cachedBlocks - b.cachedBlocks ||
    a.routed - b.routed || byId(a, b);
}

export function chooseReplica(
  candidates: readonly Candidate[],
  opts: RoutingOptions,
): RoutingChoice {
  if (candidates.length === 0) return { kind: "none" };
  const notFull = candidates.filter((c) => c.load < c.capacity);
  if (notFull.length === 0) return { kind: "overloaded" };
  // A load costs seconds; a replica with the model loaded and room takes it, the rule below
  // choosing among those. Only when none has room does one that must load it first get it.
  const warm = notFull.filter((c) => c.loaded !== false);
  const open = warm.length > 0 ? warm : notFull;
  if (opts.policy === "round-robin") {
    const sorted = [...open].sort(byId);
    const c = sorted[(opts.turn ?? 0) % sorted.length]!;
    return { kind: "replica", id: c.id, reason: "round_robin", matchedBlocks: c.matchedBlocks };
  }
  const least = [...open].sort(byLoad)[0]!;
  if (opts.policy === "prefix") {
    let best: Candidate | undefined;
    for (const c of open) {
      if (c.matchedBlocks === 0) continue;
      if (
        best === undefined || c.matchedBlocks > best.matchedBlocks ||
        (c.matchedBlocks === best.matchedBlocks && byLoad(c, best) < 0)
      ) best = c;
    }
    const abs = opts.absSlack ?? CLUSTER_DEFAULTS.absSlack;
    const slack = Math.max(abs, (opts.relSlack ?? CLUSTER_DEFAULTS.relSlack) * least.load);
    const minRecent = Math.min(...open.map((c) => c.recent));
    const overworked = (c: Candidate) =>
      c.recent >
        (opts.workBalance ?? CLUSTER_DEFAULTS.workBalance) * minRecent +
          (opts.workSlack ?? CLUSTER_DEFAULTS.workSlack);
    if (best !== undefined && best.load - least.load <= slack && !overworked(best)) {
      return { kind: "replica", id: best.id, reason: "prefix", matchedBlocks: best.matchedBlocks };
    }
    const fresh = [...open].sort(byLoadThenCache)[0]!;
    return {
      kind: "replica",
      id: fresh.id,
      reason: "least_loaded",
      matchedBlocks: fresh.matchedBlocks,
    };
  }
  return {
    kind: "replica",
    id: least.id,
    reason: "least_loaded",
    matchedBlocks: least.matchedBlocks,
  };
}

/** Leading entries of `promptHashes` found in `cached`: the blocks a replica would reuse. */
export function matchedBlocks(
  promptHashes: readonly number[],
  cached: ReadonlySet<number>,
): number {
  let n = 0;
  while (n < promptHashes.length && cached.has(promptHashes[n]!)) n++;
  return n;
}
