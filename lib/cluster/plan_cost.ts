/**
 * The planner's cost model, pure functions of a calibration (plan_calibration.ts), a model's
 * shape and bytes (plan_model.ts) and the hosts and link (plan_hosts.ts). All times in seconds.
 *
 * - A matmul over W weight bytes for r rows on one thread takes max(W / read rate, r × W ×
 *   compute cost): the weight read bounds small batches, the arithmetic large ones. Both rates
 *   come from the calibration's layer (and classifier) timed at 1 and 32 rows; a host's
 *   threads and speed divide the time.
 * - Attention reads each row's K and V for its context at the same read rate.
 * - Tensor parallelism here is exact, as built (kernels/wasm/tp_shard.ts): each layer matrix's
 *   output rows are split over N ranks and 4 outputs a layer gathered through rank 0, every
 *   rank receiving the N - 1 other shares (Megatron instead all-reduces partial sums twice per
 *   layer: fewer messages, other rounding). K/V stay local, a KV head copied on each rank past the model's
 *   KV-head count; the classifier is not split: rank 0 runs it whole while the others wait.
 * - A message costs the link's latency, the transport's per-message cost, and its bytes at the
 *   transport's per-byte cost plus the link's bandwidth.
 */
import type { Calibration } from "./plan_calibration.ts";
import type { PlanModel } from "./plan_model.ts";
import type { PlanHost, PlanLink } from "./plan_hosts.ts";

/** An f32 activation, as stages and ranks exchange them (so results stay bit-identical). */
export const ACTIVATION_BYTES = 4;

/** Bytes per row the head sends the first stage: a token id and its position. */
export const PLAN_ROW_BYTES = 8;

/** How fast one thread of the calibration machine goes through a kind of weights. */
export interface MatmulRates {
  /** Weight bytes per second of a 1-row matmul: the weight read bounds it. */
  readonly readBytesPerSecond: number;
  /** Seconds per weight byte per row once arithmetic bounds the matmul (from 32 rows). */
  readonly computeSecondsPerByteRow: number;
}

function ratesOf(bytes: number, s: { rows1: number; rows32: number }): MatmulRates {
  return { readBytesPerSecond: bytes / s.rows1, computeSecondsPerByteRow: s.rows32 / (32 * bytes) };
}

/** The layers' rates (attention's reads go at the same read rate). */
export function layerRates(cal: Calibration): MatmulRates {
  return ratesOf(cal.layerBytes, cal.layerSeconds);
}

/** The classifier's rates: timed on its own, its encoding (Q6_K in Q4_K_M files) differing. */
export function classifierRates(cal: Calibration): MatmulRates {
  return ratesOf(cal.classifierBytes, cal.classifierSeconds);
}

/** A host's throughput against one calibration thread. */
function hostRate(host: Pick<PlanHost, "threads" | "speed">): number {
  return host.threads * host.speed;
}

/** A matmul (or a run of them) over `bytes` of weights for `rows` rows on `host`. */
export function matmulSeconds(
  rates: MatmulRates,
  bytes: number,
  rows: number,
  host: Pick<PlanHost, "threads" | "speed">,
): number {
  if (rows === 0 || bytes === 0) return 0;
  const read = bytes / rates.readBytesPerSecond;
  const compute = rows * bytes * rates.computeSecondsPerByteRow;
  return Math.max(read, compute) / hostRate(host);
}

/** K/V bytes of one position of one layer, all its KV heads (a TP rank holds kvHeadsPerRank). */
export function kvBytesPerPosition(model: PlanModel, kvElementBytes: number): number {
  return 2 * model.nKvHeads * model.headDim * kvElementBytes;
}

/** The KV heads a rank of `ranks` holds and reads: its share, or a copy of one past nKvHeads. */
export function kvHeadsPerRank(model: PlanModel, ranks: number): number {
  return Math.ceil(model.nKvHeads / ranks);
}

/** Attention of one layer: `rows` rows each reading `context` positions of its K and V heads. */
export function attentionSeconds(
  cal: Calibration,
  model: PlanModel,
  rows: number,
  context: number,
  kvElementBytes: number,
  host: Pick<PlanHost, "threads" | "speed">,
  ranks = 1,
): number {
  const share = kvHeadsPerRank(model, ranks) / model.nKvHeads;
  const bytes = rows * context * kvBytesPerPosition(model, kvElementBytes) * share;
  return bytes / layerRates(cal).readBytesPerSecond / hostRate(host);
}

/** One message of `bytes` over `link`. */
export function messageSeconds(cal: Calibration, link: PlanLink, bytes: number): number {
  return link.latencySeconds + cal.transport.messageSeconds +
    bytes * (cal.transport.byteSeconds + 1 / link.bandwidthBytesPerSecond);
}

/**
 * Gathering an output of `bytes` (all ranks' shares together) on each of `ranks` ranks through
 * rank 0, the hub (lib/cluster/tp_link.ts): a round trip. The N - 1 other ranks' shares come in
 * ((N - 1) / N of the bytes, N - 1 messages), then the hub sends each of them every other
 * share (N - 1 messages of (N - 1) / N of the bytes): 2 latencies, 2 (N - 1) messages and
 * (N - 1) × the bytes through the hub.
 */
export function gatherSeconds(
  cal: Calibration,
  link: PlanLink,
  bytes: number,
  ranks: number,
): number {
  if (ranks <= 1) return 0;
  return 2 * link.latencySeconds + 2 * (ranks - 1) * cal.transport.messageSeconds +
    (ranks - 1) * bytes * (cal.transport.byteSeconds + 1 / link.bandwidthBytesPerSecond);
}

/**
 * The width (f32 values per row) of each output a TP layer gathers, in order, as
 * kernels/wasm/tp_program.ts cuts a layer: the attention heads' rows, the residual after wo,
 * the hidden rows after SwiGLU, the residual after wDown.
 */
export function tpGatherWidths(model: PlanModel): number[] {
  return [model.nHeads * model.headDim, model.dim, model.hiddenDim, model.dim];
}

/** What a stage is: its layers' weight bytes and count, its ends, its slowest rank. */
export interface StageShape {
  readonly layerBytes: number;
  readonly layers: number;
  readonly first: boolean;
  readonly last: boolean;
  /** Its ranks' slowest host (every rank waits at each gather). */
  readonly host: Pick<PlanHost, "threads" | "speed">;
  readonly ranks: number;
}

/** Where a stage's time goes for one batch. */
export interface StageTime {
  readonly compute: number;
  readonly gathers: number;
  readonly total: number;
}

/** One pass of `rows` rows (`sampled` of them through the classifier) over a stage. */
export function stageSeconds(
  cal: Calibration,
  model: PlanModel,
  link: PlanLink,
  stage: StageShape,
  rows: number,
  context: number,
  sampled: number,
  kvElementBytes: number,
): StageTime {
  const n = stage.ranks;
  let compute = matmulSeconds(layerRates(cal), stage.layerBytes / n, rows, stage.host) +
    stage.layers * attentionSeconds(cal, model, rows, context, kvElementBytes, stage.host, n);
  const perLayer = tpGatherWidths(model)
    .reduce((s, w) => s + gatherSeconds(cal, link, rows * w * ACTIVATION_BYTES, n), 0);
  // The classifier runs whole on rank 0 (nothing to gather), the other ranks waiting.
  if (stage.last && sampled > 0) {
    compute += matmulSeconds(classifierRates(cal), model.classifierBytes, sampled, stage.host);
  }
  const gathers = stage.layers * perLayer;
  return { compute, gathers, total: compute + gathers };
}

/** A pipeline's decode at a batch, with where its time goes. */
export interface PipelineTime {
  /** Tokens per second: every sequence advances one token per round. */
  readonly tokensPerSecond: number;
  readonly roundSeconds: number;
  /** The share of stage-time idle in a round. */
  readonly bubble: number;
  /** One group's trip around: its stages, hops and gathers, in seconds. */
  readonly compute: number;
  readonly gathers: number;
  readonly hops: number;
  readonly groups: number;
}

/**
 * The stage whose process the head (the scheduler and the sampler) shares: `first` (the last
 * stage sends it the logits rows that sample) or `last` (it sends the first stage the plan).
 */
export type HeadPlace = "first" | "last";
export const HEAD_PLACES: readonly HeadPlace[] = ["first", "last"];

/** The messages of one trip of `rows` rows, `sampled` of them sampled, between the processes. */
export function hopSeconds(
  cal: Calibration,
  model: PlanModel,
  link: PlanLink,
  stageCount: number,
  rows: number,
  sampled: number,
  head: HeadPlace,
): number {
  if (stageCount === 1) return 0;
  const between = (stageCount - 1) *
    messageSeconds(cal, link, rows * model.dim * ACTIVATION_BYTES);
  return between +
    (head === "first"
      ? messageSeconds(cal, link, sampled * model.vocabSize * ACTIVATION_BYTES)
      : messageSeconds(cal, link, rows * PLAN_ROW_BYTES));
}

/** What a pipeline decodes: how many sequences, how far in, and how. */
export interface PipelineRun {
  readonly sequences: number;
  /** Positions each sequence attends to. */
  readonly context: number;
  readonly kvElementBytes: number;
  readonly microBatches: boolean;
  readonly head: HeadPlace;
}

/**
 * Decoding through `stages`. With micro-batches the sequences split into as many groups as
 * stages, which follow each other through them: a round lasts the longer of one group's trip
 * round the ring and the busiest stage's work on every group. Without, one group makes the
 * trip while the other stages wait.
 */
export function pipelineDecode(
  cal: Calibration,
  model: PlanModel,
  link: PlanLink,
  stages: readonly StageShape[],
  run: PipelineRun,
): PipelineTime {
  const groups = run.microBatches ? Math.min(stages.length, run.sequences) : 1;
  const rows = Math.ceil(run.sequences / groups);
  const times = stages.map((s) =>
    stageSeconds(cal, model, link, s, rows, run.context, rows, run.kvElementBytes)
  );
  const hops = hopSeconds(cal, model, link, stages.length, rows, rows, run.head);
  const compute = times.reduce((a, t) => a + t.compute, 0);
  const gathers = times.reduce((a, t) => a + t.gathers, 0);
  const busiest = Math.max(...times.map((t) => t.total));
  const roundSeconds = Math.max(compute + gathers + hops, groups * busiest);
  const busy = groups * (compute + gathers);
  return {
    tokensPerSecond: run.sequences / roundSeconds,
    roundSeconds,
    bubble: 1 - busy / (stages.length * roundSeconds),
    compute,
    gathers,
    hops,
    groups,
  };
}

/**
 * Time to first token of one sequence with a `promptTokens`-token prompt: the prompt goes
 * through the stages as one batch (its attention at half the prompt on average), then one row
 * through the classifier.
 */
export function prefillSeconds(
  cal: Calibration,
  model: PlanModel,
  link: PlanLink,
  stages: readonly StageShape[],
  promptTokens: number,
  kvElementBytes: number,
  head: HeadPlace,
): number {
  const work = stages.reduce(
    (a, s) =>
      a + stageSeconds(cal, model, link, s, promptTokens, promptTokens / 2, 1, kvElementBytes)
        .total,
    0,
  );
  return work + hopSeconds(cal, model, link, stages.length, promptTokens, 1, head);
}

/**
 * Bytes the largest rank of a stage holds (rank 0, with the classifier where the stage is
 * last): its weights, its KV heads' cache, its process.
 */
export function stageMemoryBytes(
  model: PlanModel,
  stage: Omit<StageShape, "host">,
  sequences: number,
  context: number,
  kvElementBytes: number,
  processOverheadBytes: number,
): number {
  const n = stage.ranks;
  // Every first-stage rank looks tokens up in the whole embedding; a last stage's rank 0 holds
  // the whole classifier (in one process with a tied one, the embedding is it).
  const embedding = stage.first ? model.embeddingBytes : 0;
  const classifier = stage.last && !(stage.first && model.tiedClassifier)
    ? model.classifierBytes
    : 0;
  const kvHeads = kvHeadsPerRank(model, n);
  const kv = sequences * context * stage.layers * 2 * kvHeads * model.headDim * kvElementBytes;
  return stage.layerBytes / n + embedding + classifier + kv + processOverheadBytes;
}
