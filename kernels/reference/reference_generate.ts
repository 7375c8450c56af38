import type { Engine, SamplingParams } from "../../lib/engine/engine.ts";

/** Options for {@link referenceGenerate}. */
export interface ReferenceGenerateOptions {
  /** Sequence id to run under (default 0). */
  seqId?: number;
  /** Stop after sampling any of these (the stop token is included in the result). */
  stopTokens?: readonly number[];
  /** Keep each step's logits (the distribution each generated token was drawn from). */
  returnLogits?: boolean;
  /** KV block ids to use, in order; default 0, 1, 2, ... */
  blockTable?: readonly number[];
  /** Feed decode steps through `useLastSampled` instead of literal ids. */
  useLastSampled?: boolean;
}

/** What {@link referenceGenerate} produced. */
export interface ReferenceGeneration {
  readonly tokens: number[];
  readonly logprobs: number[];
  /** logits[i] is the distribution tokens[i] was drawn from (with returnLogits). */
  readonly logits: Float32Array[];
}

/**
 * Generates up to maxTokens tokens after a prompt of token ids, one sequence alone: a single
 * prefill step, then one decode step per token. For tests and the CLI.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { GREEDY } from "../../lib/engine/engine.ts";
 * import { loadModel } from "../../lib/model/load_model.ts";
 * import { CpuEngine } from "./cpu_engine.ts";
 *
 * const model = await loadModel("stories260K.bin");
 * const engine = new CpuEngine(model.config, model.weights, { numBlocks: 8, blockSize: 16 });
 * // "Once upon a time" (BOS first), then 60 greedy tokens: no stop token was given.
 * const { tokens } = await referenceGenerate(engine, [1, 403, 407, 261, 378], 60, GREEDY);
 * assertEquals(tokens.length, 60);
 * engine.dispose();
 * ```
 */
export async function referenceGenerate(
  engine: Engine,
  promptIds: readonly number[],
  maxTokens: number,
  sampling: SamplingParams,
  opts: ReferenceGenerateOptions = {},
): Promise<ReferenceGeneration> {
  if (promptIds.length === 0) {
    throw new Error("Cannot generate: the prompt has no tokens (add BOS)");
  }
  const seqId = opts.seqId ?? 0;
  const { blockSize, numBlocks } = engine.kv;
  const needed = Math.ceil((promptIds.length + maxTokens) / blockSize);
  const blockTable = opts.blockTable ??
    Array.from({ length: Math.min(needed, numBlocks) }, (_, i) => i);
  if (blockTable.length < needed) {
    throw new Error(
      `Cannot generate: ${promptIds.length} prompt + ${maxTokens} new tokens need ${needed} KV blocks of ${blockSize}, only ${blockTable.length} are available`,
    );
  }
  const stop = new Set(opts.stopTokens ?? []);
  const out: ReferenceGeneration = { tokens: [], logprobs: [], logits: [] };
  let pos = 0;
  let input: number[] = [...promptIds];
  for (let stepId = 0; out.tokens.length < maxTokens; stepId++) {
    const useLast = opts.useLastSampled === true && stepId > 0;
    const result = await engine.step({
      stepId,
      returnLogits: opts.returnLogits,
      seqs: [{
        seqId,
        tokens: useLast ? [] : input,
        useLastSampled: useLast,
        startPos: pos,
        blockTable,
        sample: true,
        sampling,
      }],
    });
    const s = result.sampled[0];
    if (s === undefined) {
      throw new Error(`Cannot generate: step ${stepId} returned no token for sequence ${seqId}`);
    }
    out.tokens.push(s.token);
    out.logprobs.push(s.logprob);
    if (s.logits) out.logits.push(s.logits);
    pos += input.length;
    input = [s.token];
    if (stop.has(s.token)) break;
  }
  return out;
}
