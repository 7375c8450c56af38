import type { KvGeometry, SamplingParams, SeqInput, StepPlan } from "./engine.ts";
import type { ModelConfig } from "../model/model_config.ts";
import { logitAdjustProblem } from "./logit_adjust.ts";
import { MAX_TOP_LOGPROBS } from "./top_logprobs.ts";
import { tokenMaskProblem } from "./token_mask.ts";

/** What an engine with step buffers sized up front can hold in one step. */
export interface StepCapacity {
  readonly maxRows: number;
  readonly maxSeqs: number;
  readonly maxTableEntries: number;
}

/** What the validation needs to know about an engine. */
export interface StepRules {
  readonly config: ModelConfig;
  readonly kv: KvGeometry;
  /** Whether the engine holds a last sampled token for the sequence (for `useLastSampled`). */
  hasLastSampled(seqId: number): boolean;
  /** Buffer sizes, for engines that have them. */
  readonly capacity?: StepCapacity;
  /** The engine returns hidden states (Engine.hiddenStates). */
  readonly hiddenStates?: boolean;
}

/**
 * The rules every engine holds a step plan to, checked before anything is written: a bad plan
 * fails the same way on every engine and leaves its KV cache as it was. Throws an Error naming
 * the step, the sequence, what was wrong and what was received.
 */
export function validateStep(plan: StepPlan, rules: StepRules): void {
  const { config, kv } = rules;
  const seen = new Set<number>();
  let rows = 0, tableEntries = 0;
  for (const seq of plan.seqs) {
    const where = `Cannot run step ${plan.stepId}: sequence ${seq.seqId}`;
    if (seen.has(seq.seqId)) throw new Error(`${where} appears twice in one plan`);
    seen.add(seq.seqId);
    const n = checkInputs(seq, where, config.vocabSize, rules);
    if (!(Number.isInteger(seq.startPos) && seq.startPos >= 0)) {
      throw new Error(`${where} has startPos ${seq.startPos}, expected a non-negative integer`);
    }
    const end = seq.startPos + n;
    if (end > config.contextLength) {
      throw new Error(
        `${where} reaches position ${end - 1}, past the context length ${config.contextLength}`,
      );
    }
    const needed = blocksFor(end, kv.blockSize);
    if (seq.blockTable.length < needed) {
      throw new Error(
        `${where} needs ${needed} KV blocks for positions 0..${
          end - 1
        }, its block table has ${seq.blockTable.length}`,
      );
    }
    for (let i = 0; i < needed; i++) {
      const b = seq.blockTable[i]!;
      if (!(Number.isInteger(b) && b >= 0 && b < kv.numBlocks)) {
        throw new Error(
          `${where} has block id ${b} at table entry ${i}, outside 0..${kv.numBlocks - 1}`,
        );
      }
    }
    if (seq.sample) checkSampling(seq.sampling, where);
    if (seq.hidden !== undefined) checkHidden(seq, where, rules);
    if (seq.adjust !== undefined) {
      const problem = logitAdjustProblem(seq.adjust, config.vocabSize);
      if (problem !== undefined) throw new Error(`${where} has a bad logit adjustment: ${problem}`);
    }
    const top = seq.topLogprobs;
    if (top !== undefined && !(Number.isInteger(top) && top >= 0 && top <= MAX_TOP_LOGPROBS)) {
      throw new Error(
        `${where} asks for ${top} top logprobs, expected an integer in 0..${MAX_TOP_LOGPROBS}`,
      );
    }
    if (seq.sample && seq.tokenMask !== undefined) {
      const problem = tokenMaskProblem(seq.tokenMask, config.vocabSize);
      if (problem) throw new Error(`${where}: ${problem}`);
    }
    rows += n;
    tableEntries += needed;
  }
  checkCopies(plan, kv);
  const cap = rules.capacity;
  if (
    cap && (rows > cap.maxRows || plan.seqs.length > cap.maxSeqs ||
      tableEntries > cap.maxTableEntries)
  ) {
    throw new Error(
      `Cannot run step ${plan.stepId}: it has ${rows} token rows, ${plan.seqs.length} sequences and ${tableEntries} block-table entries; the engine was sized for ${cap.maxRows} rows (maxBatchTokens), ${cap.maxSeqs} sequences (maxSeqs), ${cap.maxTableEntries} entries`,
    );
  }
}

/**
 * A step's block copies name blocks of the pool, never copy a block onto itself, and write each
 * destination once (a second write would make the order of two copies matter).
 */
function checkCopies(plan: StepPlan, kv: KvGeometry): void {
  const copies = plan.kvCopies;
  if (copies === undefined) return;
  const written = new Set<number>();
  for (const pair of copies) {
    const [src, dst] = pair;
    const inPool = (b: number) => Number.isInteger(b) && b >= 0 && b < kv.numBlocks;
    if (!inPool(src) || !inPool(dst) || src === dst || written.has(dst)) {
      throw new Error(
        `Cannot run step ${plan.stepId}: KV copy [${src}, ${dst}] must name two different blocks in 0..${
          kv.numBlocks - 1
        } and a destination no other copy of the step writes`,
      );
    }
    written.add(dst);
  }
}

/** Hidden states come from an engine that has them, for rows of known tokens. */
function checkHidden(seq: SeqInput, where: string, rules: StepRules): void {
  if (seq.hidden !== "all" && seq.hidden !== "last") {
    throw new Error(
      `${where} asks for hidden rows ${JSON.stringify(seq.hidden)}, expected "all" or "last"`,
    );
  }
  if (!rules.hiddenStates) {
    throw new Error(`${where} asks for hidden states, which this engine does not return`);
  }
  if (seq.useLastSampled) {
    throw new Error(
      `${where} asks for hidden states of its last sampled token; only known tokens have them`,
    );
  }
}

/** Whether `t` is a token id of a vocabulary of `vocabSize` ids. */
export function isTokenId(t: number, vocabSize: number): boolean {
  return Number.isInteger(t) && t >= 0 && t < vocabSize;
}

/** KV blocks covering positions [0, end). */
export function blocksFor(end: number, blockSize: number): number {
  return Math.ceil(end / blockSize);
}

/** Checks the sequence's new tokens; returns how many rows it adds. */
function checkInputs(seq: SeqInput, where: string, vocabSize: number, rules: StepRules): number {
  if (seq.useLastSampled) {
    const has = rules.hasLastSampled(seq.seqId);
    if (seq.tokens.length !== 0 || !has) {
      throw new Error(
        `${where} asks for its last sampled token, which needs empty tokens and an earlier sampled step; received ${seq.tokens.length} tokens, last sampled ${
          has ? "held" : "none"
        }`,
      );
    }
    return 1;
  }
  if (seq.tokens.length === 0) throw new Error(`${where} has no new tokens`);
  for (const t of seq.tokens) {
    if (!isTokenId(t, vocabSize)) {
      throw new Error(`${where} has token ${t} outside the vocabulary 0..${vocabSize - 1}`);
    }
  }
  return seq.tokens.length;
}

function checkSampling(p: SamplingParams, where: string): void {
  const bad: string[] = [];
  if (!Number.isFinite(p.temperature)) bad.push(`temperature ${p.temperature}`);
  if (!(Number.isInteger(p.topK) && p.topK >= 0)) bad.push(`topK ${p.topK}`);
  if (!(p.topP >= 0 && p.topP <= 1)) bad.push(`topP ${p.topP}`);
  if (!(p.minP >= 0 && p.minP <= 1)) bad.push(`minP ${p.minP}`);
  if (!Number.isFinite(p.seed)) bad.push(`seed ${p.seed}`);
  if (bad.length > 0) {
    throw new Error(
      `${where} has invalid sampling parameters (${
        bad.join(", ")
      }); expected a finite temperature, an integer topK >= 0, topP and minP in 0..1 and a finite seed`,
    );
  }
}
