import type { KvGeometry, StepPlan } from "../../lib/engine/engine.ts";
import type { ModelConfig } from "../../lib/model/model_config.ts";
import { blocksFor, validateStep } from "../../lib/engine/step_validation.ts";
import {
  LAST_SAMPLED_FLAG,
  type RowMeta,
  type SampleMeta,
  type SeqMeta,
  type StepCapacity,
  type StepContent,
} from "./step_meta.ts";

/** A plan as the kernels see it, with the sequences that sample in plan order. */
export interface PlannedStep {
  readonly content: StepContent;
  readonly sampledSeqIds: readonly number[];
  /** The token rows whose hidden states the plan asks for (SeqInput.hidden), in plan order. */
  readonly hidden: readonly HiddenRange[];
}

/** One sequence's hidden rows: `count` token rows of the step from `row`, at `startPos` on. */
export interface HiddenRange {
  readonly seqId: number;
  readonly startPos: number;
  readonly row: number;
  readonly count: number;
}

/**
 * The device slot of a sequence's last sampled token: `create` asks for one when the
 * sequence samples in this step; without it, undefined means it never sampled.
 */
export type SlotLookup = (seqId: number, create: boolean) => number | undefined;

/**
 * Checks a plan with the rules every engine shares (lib/engine/step_validation.ts) and
 * flattens it into token rows, sequences, samples, concatenated block tables and the rows whose
 * hidden states come back. Nothing is written anywhere, and slots are claimed only once the
 * whole plan checks out; the caller packs the result.
 */
export function planStep(
  plan: StepPlan,
  config: ModelConfig,
  kv: KvGeometry,
  capacity: StepCapacity,
  slotFor: SlotLookup,
): PlannedStep {
  validateStep(plan, {
    config,
    kv,
    capacity,
    hasLastSampled: (seqId) => slotFor(seqId, false) !== undefined,
    hiddenStates: true,
  });
  const rows: RowMeta[] = [];
  const seqs: SeqMeta[] = [];
  const samples: SampleMeta[] = [];
  const tables: number[] = [];
  const sampledSeqIds: number[] = [];
  const hidden: HiddenRange[] = [];
  for (const seq of plan.seqs) {
    const tokens = seq.useLastSampled ? [LAST_SAMPLED_FLAG | slotFor(seq.seqId, false)!] : [
      ...seq.tokens,
    ];
    const end = seq.startPos + tokens.length;
    const table = seq.blockTable.slice(0, blocksFor(end, kv.blockSize));
    const s = seqs.length;
    tokens.forEach((token, j) => {
      const pos = seq.startPos + j;
      rows.push({
        token,
        pos,
        seq: s,
        slot: table[Math.floor(pos / kv.blockSize)]! * kv.blockSize + (pos % kv.blockSize),
      });
    });
    seqs.push({ tableOffset: tables.length, tableLength: table.length, lastRow: rows.length - 1 });
    tables.push(...table);
    if (seq.hidden) {
      const count = seq.hidden === "all" ? tokens.length : 1;
      hidden.push({ seqId: seq.seqId, startPos: end - count, row: rows.length - count, count });
    }
    if (!seq.sample) continue;
    const p = seq.sampling;
    sampledSeqIds.push(seq.seqId);
    samples.push({
      row: rows.length - 1,
      lastSlot: 0, // claimed below
      seed: p.seed >>> 0,
      position: end,
      temperature: p.temperature,
      topK: p.topK,
      topP: p.topP,
      minP: p.minP,
    });
  }
  // Claimed after every lookup above: a claim may evict the least recently used slot, which
  // must not be one this plan still reads.
  const withSlots = samples.map((m, i) => ({ ...m, lastSlot: slotFor(sampledSeqIds[i]!, true)! }));
  return {
    content: { rows, seqs, samples: withSlots, blockTables: tables },
    sampledSeqIds,
    hidden,
  };
}
