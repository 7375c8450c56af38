/**
 * The planner: every TP × PP × DP layout of a model over some hosts, each split into stages
 * that fit in its hosts' memory, with its predicted decode speed at 1 and at N sequences and
 * its time to first token (plan_cost.ts), best first, each with why it wins or loses.
 *
 * Hosts are taken in order: replica d's stage s's rank r is host d·TP·PP + s·TP + r. A layout
 * uses floor(hosts / (TP·PP)) replicas, which share the N sequences evenly.
 */
import type { Calibration } from "./plan_calibration.ts";
import type { PlanModel } from "./plan_model.ts";
import type { PlanCluster, PlanHost } from "./plan_hosts.ts";
import {
  type HeadPlace,
  pipelineDecode,
  type PipelineTime,
  prefillSeconds,
  stageMemoryBytes,
  stageSeconds,
  type StageShape,
  tpGatherWidths,
} from "./plan_cost.ts";
import { formatBytes } from "../util/byte_size.ts";

export interface Layout {
  readonly tp: number;
  readonly pp: number;
  readonly dp: number;
}

export interface PlanOptions {
  /** The batch the throughput column is for (the 32). */
  readonly sequences: number;
  /** Positions each sequence holds in the KV cache and attends to while decoding. */
  readonly context: number;
  /** The prompt of the time-to-first-token column. */
  readonly promptTokens: number;
  readonly kvElementBytes: number;
  readonly processOverheadBytes: number;
  readonly head: HeadPlace;
}

/** A layout's prediction, the hook real runs are checked against. */
export interface Prediction {
  /** Decode tokens per second of one sequence alone. */
  readonly tokensPerSecond1: number;
  /** Decode tokens per second of all replicas with the N sequences shared out. */
  readonly tokensPerSecondN: number;
  /** The same without micro-batches (equal to the above where PP is 1). */
  readonly tokensPerSecondNNoMicroBatches: number;
  readonly ttftSeconds: number;
  /** Replica 0's decode at its share of the N sequences, with micro-batches. */
  readonly round: PipelineTime;
  /** Layers per stage. */
  readonly split: readonly number[];
  /** The host that needs the largest share of its memory, and how much it needs. */
  readonly peak: { readonly host: PlanHost; readonly bytes: number };
}

export type LayoutPlan =
  & { readonly layout: Layout; readonly hostsUsed: number }
  & ({ readonly fits: true; readonly prediction: Prediction; readonly why: string } | {
    readonly fits: false;
    readonly why: string;
  });

/** Sequences of replica `d` of `dp` when `n` are shared out evenly. */
function shareOf(n: number, dp: number, d: number): number {
  return Math.floor(n / dp) + (d < n % dp ? 1 : 0);
}

/** The hosts of replica `d`'s stage `s`. */
function stageHosts(hosts: readonly PlanHost[], l: Layout, d: number, s: number): PlanHost[] {
  const at = d * l.tp * l.pp + s * l.tp;
  return hosts.slice(at, at + l.tp);
}

function slowest(hosts: readonly PlanHost[]): PlanHost {
  return hosts.reduce((a, h) => (h.threads * h.speed < a.threads * a.speed ? h : a));
}

/**
 * The contiguous split of `n` layers into `k` non-empty stages that minimizes the largest
 * `cost(stage, from, to)` (Infinity: that stage cannot take those layers). Returns the layer
 * counts and that cost.
 */
export function splitLayers(
  n: number,
  k: number,
  cost: (stage: number, from: number, to: number) => number,
): { counts: number[]; worst: number } {
  // best[s][j]: the least worst cost of stages 0..s-1 holding layers 0..j-1.
  const best = Array.from({ length: k + 1 }, () => new Float64Array(n + 1).fill(Infinity));
  const cut = Array.from({ length: k + 1 }, () => new Int32Array(n + 1));
  best[0]![0] = 0;
  for (let s = 1; s <= k; s++) {
    for (let j = s; j <= n - (k - s); j++) {
      for (let i = s - 1; i < j; i++) {
        const v = Math.max(best[s - 1]![i]!, cost(s - 1, i, j));
        if (v < best[s]![j]!) {
          best[s]![j] = v;
          cut[s]![j] = i;
        }
      }
    }
  }
  const counts: number[] = [];
  let j = n;
  for (let s = k; s >= 1; s--) {
    const i = cut[s]![j]!;
    counts.unshift(j - i);
    j = i;
  }
  return { counts, worst: best[k]![n]! };
}

interface ReplicaPlan {
  readonly stages: StageShape[];
  readonly memory: { host: PlanHost; bytes: number }[];
}

/**
 * `f(bytes, layers)` read as a·bytes + b·layers + c from three of its values: the split weighs
 * every range of layers for every stage, and a stage's time and memory are linear in its layer
 * bytes and count (the cost model's terms are) once its rows and ends are fixed.
 */
function linear(f: (bytes: number, layers: number) => number) {
  const c = f(0, 0), perByte = (f(1e9, 0) - c) / 1e9, perLayer = f(0, 1) - c;
  return (bytes: number, layers: number) => perByte * bytes + perLayer * layers + c;
}

/** Replica `d`'s stages, split for speed among the splits that fit; or where it does not fit. */
function planReplica(
  model: PlanModel,
  cluster: PlanCluster,
  cal: Calibration,
  l: Layout,
  d: number,
  o: PlanOptions,
): ReplicaPlan | { host: PlanHost; bytes: number } {
  const prefix = [0];
  for (const b of model.layerBytes) prefix.push(prefix.at(-1)! + b);
  const bytesOf = (i: number, j: number) => prefix[j]! - prefix[i]!;
  const sequences = Math.max(1, shareOf(o.sequences, l.dp, d));
  const rows = Math.ceil(sequences / l.pp);
  const hostsOf = (s: number) => stageHosts(cluster.hosts, l, d, s);
  const shape = (s: number, layerBytes: number, layers: number): StageShape => ({
    layerBytes,
    layers,
    first: s === 0,
    last: s === l.pp - 1,
    host: slowest(hostsOf(s)),
    ranks: l.tp,
  });
  const stages = Array.from({ length: l.pp }, (_, s) => ({
    room: Math.min(...hostsOf(s).map((h) => h.memoryBytes)),
    time: linear((b, n) =>
      stageSeconds(
        cal,
        model,
        cluster.link,
        shape(s, b, n),
        rows,
        o.context,
        rows,
        o.kvElementBytes,
      )
        .total
    ),
    memory: linear((b, n) =>
      stageMemoryBytes(
        model,
        shape(s, b, n),
        sequences,
        o.context,
        o.kvElementBytes,
        o.processOverheadBytes,
      )
    ),
  }));
  const memory = (s: number, i: number, j: number) => stages[s]!.memory(bytesOf(i, j), j - i);
  const n = model.layerBytes.length;
  const fast = splitLayers(
    n,
    l.pp,
    (s, i, j) =>
      memory(s, i, j) > stages[s]!.room ? Infinity : stages[s]!.time(bytesOf(i, j), j - i),
  );
  if (fast.worst === Infinity) {
    // Say where the split that needs the least beyond its hosts' memory falls short.
    const tight = splitLayers(n, l.pp, (s, i, j) => memory(s, i, j) - stages[s]!.room);
    let worst = { host: cluster.hosts[0]!, bytes: 0, over: -Infinity };
    boundsOf(tight.counts).forEach(([i, j], s) => {
      const bytes = memory(s, i, j);
      for (const host of hostsOf(s)) {
        if (bytes - host.memoryBytes > worst.over) {
          worst = { host, bytes, over: bytes - host.memoryBytes };
        }
      }
    });
    return { host: worst.host, bytes: worst.bytes };
  }
  const bounds = boundsOf(fast.counts);
  return {
    stages: bounds.map(([i, j], s) => shape(s, bytesOf(i, j), j - i)),
    memory: bounds.flatMap(([i, j], s) =>
      hostsOf(s).map((host) => ({ host, bytes: memory(s, i, j) }))
    ),
  };
}

function boundsOf(counts: readonly number[]): [number, number][] {
  let at = 0;
  return counts.map((c) => [at, at += c] as [number, number]);
}

/** Every replica of a layout planned, or why one does not fit. */
function planReplicas(
  model: PlanModel,
  cluster: PlanCluster,
  cal: Calibration,
  layout: Layout,
  o: PlanOptions,
): ReplicaPlan[] | string {
  const { tp, pp, dp } = layout;
  const replicas: ReplicaPlan[] = [];
  // Replicas on alike hosts with as many sequences split alike: plan one of them once.
  const planned = new Map<string, ReturnType<typeof planReplica>>();
  for (let d = 0; d < dp; d++) {
    const key = JSON.stringify([
      shareOf(o.sequences, dp, d),
      cluster.hosts.slice(d * tp * pp, (d + 1) * tp * pp).map((h) => [
        h.memoryBytes,
        h.threads,
        h.speed,
      ]),
    ]);
    const r = planned.get(key) ?? planReplica(model, cluster, cal, layout, d, o);
    planned.set(key, r);
    if (!("stages" in r)) {
      return `does not fit: needs ${formatBytes(r.bytes)} on ${r.host.name} (has ${
        formatBytes(r.host.memoryBytes)
      })`;
    }
    replicas.push(r);
  }
  return replicas;
}

/**
 * What a layout is predicted to do on these hosts, or why it cannot run. This is the hook the
 * predicted-against-measured check of real pipeline runs calls.
 */
export function predictLayout(
  model: PlanModel,
  cluster: PlanCluster,
  cal: Calibration,
  layout: Layout,
  o: PlanOptions,
): Prediction | { refused: string } {
  const { tp, pp, dp } = layout;
  if (tp * pp * dp > cluster.hosts.length) {
    return { refused: `needs ${tp * pp * dp} hosts, ${cluster.hosts.length} given` };
  }
  if (pp > model.layerBytes.length) {
    return { refused: `${pp} stages for ${model.layerBytes.length} layers` };
  }
  const replicas = planReplicas(model, cluster, cal, layout, o);
  if (typeof replicas === "string") return { refused: replicas };
  const decode = (d: number, sequences: number, microBatches: boolean) =>
    pipelineDecode(cal, model, cluster.link, replicas[d]!.stages, {
      sequences,
      context: o.context,
      kvElementBytes: o.kvElementBytes,
      microBatches,
      head: o.head,
    });
  const total = (micro: boolean) =>
    replicas.reduce((a, _, d) => {
      const share = shareOf(o.sequences, dp, d);
      return a + (share === 0 ? 0 : decode(d, share, micro).tokensPerSecond);
    }, 0);
  // A lone sequence may land on any replica: the slowest one is the promise.
  const alone = replicas.map((_, d) => decode(d, 1, false).tokensPerSecond);
  const ttft = replicas.map((r) =>
    prefillSeconds(cal, model, cluster.link, r.stages, o.promptTokens, o.kvElementBytes, o.head)
  );
  const peak = replicas.flatMap((r) => r.memory).reduce((a, m) =>
    m.bytes / m.host.memoryBytes > a.bytes / a.host.memoryBytes ? m : a
  );
  return {
    tokensPerSecond1: Math.min(...alone),
    tokensPerSecondN: total(true),
    tokensPerSecondNNoMicroBatches: total(false),
    ttftSeconds: Math.max(...ttft),
    round: decode(0, Math.max(1, shareOf(o.sequences, dp, 0)), true),
    split: replicas[0]!.stages.map((s) => s.layers),
    peak,
  };
}

/** The TP degrees tried: powers of two, as the heads of the models served split evenly. */
export const PLAN_TP_DEGREES: readonly number[] = [1, 2, 4, 8, 16];

/** Every TP × PP pair the hosts allow, each with as many replicas as the hosts hold. */
export function layouts(hostCount: number, layers: number): Layout[] {
  const out: Layout[] = [];
  for (const tp of PLAN_TP_DEGREES.filter((t) => t <= hostCount)) {
    for (let pp = 1; pp <= Math.min(Math.floor(hostCount / tp), layers); pp++) {
      out.push({ tp, pp, dp: Math.floor(hostCount / (tp * pp)) });
    }
  }
  return out;
}

export type RankBy = "throughput" | "latency" | "ttft";
export const RANK_BY: readonly RankBy[] = ["throughput", "latency", "ttft"];

/** How good a prediction is for `by`: higher is better. */
function score(p: Prediction, by: RankBy): number {
  return by === "throughput"
    ? p.tokensPerSecondN
    : by === "latency"
    ? p.tokensPerSecond1
    : -p.ttftSeconds;
}

/** Every layout of the hosts, the ones that fit best first by `by`, then those that do not. */
export function planLayouts(
  model: PlanModel,
  cluster: PlanCluster,
  cal: Calibration,
  o: PlanOptions,
  by: RankBy = "throughput",
): LayoutPlan[] {
  const all = layouts(cluster.hosts.length, model.layerBytes.length).map((layout) => {
    const p = predictLayout(model, cluster, cal, layout, o);
    return { layout, hostsUsed: layout.tp * layout.pp * layout.dp, p };
  });
  const fitting = all.flatMap((a) => "refused" in a.p ? [] : [{ ...a, p: a.p }]);
  fitting.sort((a, b) =>
    score(b.p, by) - score(a.p, by) || b.p.tokensPerSecondN - a.p.tokensPerSecondN ||
    a.hostsUsed - b.hostsUsed
  );
  const best = fitting[0]?.p;
  const fit: LayoutPlan[] = fitting.map((a) => ({
    layout: a.layout,
    hostsUsed: a.hostsUsed,
    fits: true,
    prediction: a.p,
    why: whyOf(model, cluster, a.layout, a.p, best!, by, o),
  }));
  const refused: LayoutPlan[] = all.flatMap((a) =>
    "refused" in a.p
      ? [{ layout: a.layout, hostsUsed: a.hostsUsed, fits: false as const, why: a.p.refused }]
      : []
  );
  return [...fit, ...refused];
}

const pct = (x: number) => `${Math.round(100 * x)}%`;
const ms = (s: number) => s >= 0.01 ? `${Math.round(s * 1000)} ms` : `${(s * 1000).toFixed(2)} ms`;

/** Why a layout wins or loses: its rank against the best, then what dominates its step. */
export function whyOf(
  model: PlanModel,
  cluster: PlanCluster,
  l: Layout,
  p: Prediction,
  best: Prediction,
  by: RankBy,
  o: PlanOptions,
): string {
  const r = p.round;
  const trip = r.compute + r.gathers + r.hops;
  const facts: [number, string][] = [];
  const lat = cluster.link.latencySeconds === 0
    ? "no latency"
    : `${ms(cluster.link.latencySeconds)} each`;
  if (l.tp > 1) {
    const perToken = p.split.reduce((a, s) => a + s, 0) * tpGatherWidths(model).length;
    facts.push([
      r.gathers / trip,
      `gathers ${pct(r.gathers / trip)} of a step (${perToken} per token, ${lat})`,
    ]);
  }
  if (l.pp > 1) {
    facts.push([r.hops / trip, `hops ${pct(r.hops / trip)} of a step (${l.pp} per token, ${lat})`]);
    facts.push([
      r.bubble,
      r.groups < l.pp
        ? `bubble ${pct(r.bubble)}: ${r.groups} sequence${
          r.groups === 1 ? "" : "s"
        } per replica cannot fill ${l.pp} stages`
        : `bubble ${pct(r.bubble)}; without micro-batches ${
          p.tokensPerSecondNNoMicroBatches.toFixed(1)
        } tok/s at ${o.sequences}`,
    ]);
  }
  facts.push([r.compute / trip - 0.5, `compute ${pct(r.compute / trip)} of a step`]);
  if (l.dp > 1) facts.push([0.3, `${l.dp} replicas share the ${o.sequences} sequences`]);
  const top = facts.sort((a, b) => b[0] - a[0]).slice(0, 2).map((f) => f[1]);
  const ratio = by === "ttft" ? best.ttftSeconds / p.ttftSeconds : score(p, by) / score(best, by);
  const lead = p === best ? "best" : `${ratio.toFixed(2)}× the best`;
  return [lead, ...top].join("; ");
}
