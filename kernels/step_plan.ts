import type { KvGeometry, StepPlan } from "../lib/engine/engine.ts";
import type { ModelConfig } from "../lib/model/model_config.ts";
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
}

/**
 * The device slot of a sequence's last sampled token: `create` asks for one when the
 * sequence samples in this step; without it, undefined means it never sampled.
 */
export type SlotLookup = (seqId: number, create: boolean) => number | undefined;

/**
 * Checks a plan (the same rules as the CPU reference, so a bad plan fails the same way on
 * both) and flattens it into token rows, sequences, samples and concatenated block tables.
 * Nothing is written anywhere; the caller packs the result.
 */
export function planStep(
  plan: StepPlan,
  config: ModelConfig,
  kv: KvGeometry,
  capacity: StepCapacity,
  slotFor: SlotLookup,
): PlannedStep {
  const rows: RowMeta[] = [];
  const seqs: SeqMeta[] = [];
  const samples: SampleMeta[] = [];
  const tables: number[] = [];
  const sampledSeqIds: number[] = [];
  const seen = new Set<number>();
  // Slots are claimed only once the whole plan checks out.
  const claims: number[] = [];
  for (const seq of plan.seqs) {
    const where = `Cannot run step ${plan.stepId}: sequence ${seq.seqId}`;
    if (seen.has(seq.seqId)) throw new Error(`${where} appears twice in one plan`);
    seen.add(seq.seqId);
    let tokens: number[];
    if (seq.useLastSampled) {
      const slot = slotFor(seq.seqId, false);
      if (seq.tokens.length !== 0 || slot === undefined) {
        throw new Error(
          `${where} asks for its last sampled token, which needs empty tokens and an earlier sampled step; received ${seq.tokens.length} tokens, last sampled ${
            slot === undefined ? "none" : "on the device"
          }`,
        );
      }
      tokens = [LAST_SAMPLED_FLAG | slot];
    } else {
      if (seq.tokens.length === 0) throw new Error(`${where} has no new tokens`);
      for (const t of seq.tokens) {
        if (!(Number.isInteger(t) && t >= 0 && t < config.vocabSize)) {
          throw new Error(
            `${where} has token ${t} outside the vocabulary 0..${config.vocabSize - 1}`,
          );
        }
      }
      tokens = [...seq.tokens];
    }
    if (!(Number.isInteger(seq.startPos) && seq.startPos >= 0)) {
      throw new Error(`${where} has startPos ${seq.startPos}, expected a non-negative integer`);
    }
    const end = seq.startPos + tokens.length;
    if (end > config.contextLength) {
      throw new Error(
        `${where} reaches position ${end - 1}, past the context length ${config.contextLength}`,
      );
    }
    const needed = Math.ceil(end / kv.blockSize);
    if (seq.blockTable.length < needed) {
      throw new Error(
        `${where} needs ${needed} KV blocks for positions 0..${
          end - 1
        }, its block table has ${seq.blockTable.length}`,
      );
    }
    const table = seq.blockTable.slice(0, needed);
    for (const b of table) {
      if (!(Number.isInteger(b) && b >= 0 && b < kv.numBlocks)) {
        throw new Error(`${where} has block id ${b} outside 0..${kv.numBlocks - 1}`);
      }
    }
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
    if (seq.sample) {
      const p = seq.sampling;
      if (
        Number.isNaN(p.temperature) || !(Number.isInteger(p.topK) && p.topK >= 0) ||
        !(p.topP >= 0 && p.topP <= 1) || !(p.minP >= 0 && p.minP <= 1)
      ) {
        throw new Error(`${where} has invalid sampling parameters ${JSON.stringify(p)}`);
      }
      claims.push(seq.seqId);
      sampledSeqIds.push(seq.seqId);
      samples.push({
        row: rows.length - 1,
        lastSlot: 0, // filled below
        seed: p.seed >>> 0,
        position: end,
        temperature: p.temperature,
        topK: p.topK,
        topP: p.topP,
        minP: p.minP,
      });
    }
  }
  if (
    rows.length > capacity.maxRows || seqs.length > capacity.maxSeqs ||
    tables.length > capacity.maxTableEntries
  ) {
    throw new Error(
      `Cannot run step ${plan.stepId}: it has ${rows.length} token rows, ${seqs.length} sequences and ${tables.length} block-table entries; the engine was sized for ${capacity.maxRows} rows (maxBatchTokens), ${capacity.maxSeqs} sequences (maxSeqs), ${capacity.maxTableEntries} entries`,
    );
  }
  const withSlots = samples.map((s, i) => ({ ...s, lastSlot: slotFor(claims[i]!, true)! }));
  return { content: { rows, seqs, samples: withSlots, blockTables: tables }, sampledSeqIds };
}
