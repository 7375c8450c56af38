import type {
  Engine,
  HiddenStates,
  KvGeometry,
  SampledToken,
  SamplingParams,
  SeqInput,
  StepPlan,
  StepResult,
} from "../../lib/engine/engine.ts";
import { allowedIds } from "../../lib/engine/token_mask.ts";
import type { ModelConfig } from "../../lib/model/model_config.ts";
import { hash32 } from "../../lib/util/rng.ts";
import { validateStep } from "../../lib/engine/step_validation.ts";

/**
 * A scripted stand-in for a model, for testing the serving core without one. Its "KV cache" is
 * real and paged: each slot stores a token and its position. A sampling row reads back every
 * position of its sequence through the block table (as attention does) and hashes them in
 * order; the next token is a function of that hash, that is of the sequence's whole token
 * history and nothing else (not its id, batch or blocks). So a wrong entry anywhere in a block
 * table, a block shared by mistake or a lost KV write changes the tokens, and reading a slot
 * that holds another position throws. Plans are checked by the rules every engine shares.
 */

const ROOT = 0x2545f491;

/** Chain step: the hash after `token` at `pos`, given the hash before it. */
export function fakeChain(prev: number, token: number, pos: number): number {
  return hash32((prev ^ Math.imul(token + 1, 0x9e3779b1)) >>> 0, pos);
}

/**
 * The token drawn after a history whose chain hash is `h` and whose last position is `pos`:
 * one of `outputIds` when given (e.g. a real vocabulary's word tokens), else any id.
 */
export function fakeDraw(
  h: number,
  pos: number,
  sampling: SamplingParams,
  vocabSize: number,
  outputIds?: readonly number[],
): number {
  const x = sampling.temperature <= 0 ? h : hash32((h ^ sampling.seed) >>> 0, pos + 1);
  return outputIds ? outputIds[x % outputIds.length]! : x % vocabSize;
}

function fakeLogprob(h: number): number {
  return -((h >>> 20) / 4096) * 8;
}

export interface FakeContinuationOptions {
  readonly maxTokens: number;
  readonly stopTokenIds?: readonly number[];
  readonly contextLength: number;
  readonly vocabSize: number;
  readonly sampling: SamplingParams;
  readonly outputIds?: readonly number[];
}

/**
 * What a FakeEngine generates for `prompt` alone, computed directly (no KV, no scheduler):
 * the oracle for "the same tokens as a solo run". Includes the stop token if one ends it.
 */
export function fakeContinuation(
  prompt: readonly number[],
  opts: FakeContinuationOptions,
): number[] {
  const stop = new Set(opts.stopTokenIds ?? []);
  const maxTotal = Math.min(prompt.length + opts.maxTokens, opts.contextLength);
  let h = ROOT;
  prompt.forEach((t, pos) => (h = fakeChain(h, t, pos)));
  const out: number[] = [];
  let pos = prompt.length - 1;
  while (prompt.length + out.length < maxTotal) {
    const t = fakeDraw(h, pos, opts.sampling, opts.vocabSize, opts.outputIds);
    out.push(t);
    if (stop.has(t)) break;
    pos++;
    h = fakeChain(h, t, pos);
  }
  return out;
}

export interface FakeEngineOptions {
  readonly vocabSize?: number;
  /** The ids it may sample (default: the whole vocabulary). */
  readonly outputIds?: readonly number[];
  readonly contextLength?: number;
  readonly numBlocks?: number;
  readonly blockSize?: number;
  /**
   * Fault injection: when it returns true for a step, the engine writes half the step's KV and
   * throws (a device lost mid-step).
   */
  readonly failWhen?: (plan: StepPlan, callIndex: number) => boolean;
  /** Resolve each step after this many ms (default: on the next microtask). */
  readonly latencyMs?: number;
  /**
   * Called with each step's plan as it is taken: a promise returned holds that step's result (and so
   * every later one) until it resolves, so a test can keep generations in flight for as long
   * as it needs instead of hoping they are still running.
   */
  readonly holdWhen?: (plan: StepPlan) => Promise<void> | undefined;
  /** What it says of itself as Engine.resultsOnHost (default: unset, like the reference engine). */
  readonly resultsOnHost?: boolean;
}

/** See the module comment. Steps run synchronously inside step(), so they execute in call order. */
export class FakeEngine implements Engine {
  readonly name = "fake";
  readonly hiddenStates = true;
  readonly config: ModelConfig;
  readonly kv: KvGeometry;
  readonly resultsOnHost?: boolean;
  /** step() calls so far, failed ones included. */
  calls = 0;
  /** Token rows computed so far. */
  tokensComputed = 0;
  /** release() calls so far. */
  released = 0;
  /** KV blocks copied so far (StepPlan.kvCopies). */
  blocksCopied = 0;
  #opts: FakeEngineOptions;
  #slotToken: Int32Array;
  #slotPos: Int32Array;
  #lastSampled = new Map<number, number>();
  #disposed = false;

  constructor(opts: FakeEngineOptions = {}) {
    this.#opts = opts;
    if (opts.resultsOnHost !== undefined) this.resultsOnHost = opts.resultsOnHost;
    const vocabSize = opts.vocabSize ?? 64;
    const contextLength = opts.contextLength ?? 2048;
    this.kv = { numBlocks: opts.numBlocks ?? 256, blockSize: opts.blockSize ?? 16 };
    this.config = {
      architecture: "llama",
      dim: 8,
      hiddenDim: 16,
      nLayers: 1,
      nHeads: 1,
      nKvHeads: 1,
      headDim: 8,
      vocabSize,
      contextLength,
      ropeTheta: 10000,
      ropeDim: 8,
      rmsEps: 1e-5,
    };
    const slots = this.kv.numBlocks * this.kv.blockSize;
    this.#slotToken = new Int32Array(slots);
    this.#slotPos = new Int32Array(slots).fill(-1);
  }

  step(plan: StepPlan): Promise<StepResult> {
    let result: StepResult;
    try {
      result = this.run(plan);
    } catch (e) {
      return Promise.reject(e);
    }
    const ms = this.#opts.latencyMs ?? 0;
    const held = this.#opts.holdWhen?.(plan);
    const delayed = ms <= 0
      ? Promise.resolve(result)
      : new Promise<StepResult>((resolve) => setTimeout(() => resolve(result), ms));
    return held ? held.then(() => delayed) : delayed;
  }

  /** The step, synchronously (tests that drive the scheduler by hand use this). */
  run(plan: StepPlan): StepResult {
    if (this.#disposed) throw new Error("FakeEngine: step() after dispose()");
    const call = this.calls++;
    // The same rules as every engine, before anything is written.
    validateStep(plan, {
      config: this.config,
      kv: this.kv,
      hasLastSampled: (seqId) => this.#lastSampled.has(seqId),
      hiddenStates: true,
    });
    const failAt = this.#opts.failWhen?.(plan, call) ? Math.floor(plan.seqs.length / 2) : -1;
    const { blockSize } = this.kv;
    // Copy-on-write of shared partial blocks: whole blocks, before the step writes anything.
    for (const [src, dst] of plan.kvCopies ?? []) {
      this.#slotToken.copyWithin(dst * blockSize, src * blockSize, (src + 1) * blockSize);
      this.#slotPos.copyWithin(dst * blockSize, src * blockSize, (src + 1) * blockSize);
      this.blocksCopied++;
    }
    const sampled: SampledToken[] = [];
    const hidden: HiddenStates[] = [];
    for (let i = 0; i < plan.seqs.length; i++) {
      if (i === failAt) {
        throw new Error(
          `FakeEngine: injected fault in step ${plan.stepId} after ${i} of ${plan.seqs.length} sequences`,
        );
      }
      const input = plan.seqs[i]!;
      const table = input.blockTable;
      const slot = (pos: number) =>
        table[Math.floor(pos / blockSize)]! * blockSize + (pos % blockSize);
      const tokens = input.useLastSampled ? [this.#lastSampled.get(input.seqId)!] : input.tokens;
      for (let k = 0; k < tokens.length; k++) {
        const s = slot(input.startPos + k);
        this.#slotToken[s] = tokens[k]!;
        this.#slotPos[s] = input.startPos + k;
      }
      this.tokensComputed += tokens.length;
      // "Attention": a row reads every position before it through the block table, as a real
      // engine's does, so what it gives depends on every slot and every table entry.
      const chainTo = (end: number) => {
        let h = ROOT;
        for (let pos = 0; pos < end; pos++) {
          const s = slot(pos);
          if (this.#slotPos[s] !== pos) {
            throw new Error(
              `FakeEngine (step ${plan.stepId}, seq ${input.seqId}): position ${pos} reads slot ${s} through table entry ${
                Math.floor(pos / blockSize)
              }, which holds position ${this.#slotPos[s]}`,
            );
          }
          h = fakeChain(h, this.#slotToken[s]!, pos);
        }
        return h;
      };
      if (input.hidden) hidden.push(this.#hidden(input, tokens.length, chainTo));
      if (!input.sample) continue;
      const end = input.startPos + tokens.length;
      const h = chainTo(end);
      // Constrained: the draw picks among the ids the mask allows, as a real sampler would.
      const token = input.tokenMask
        ? fakeDraw(
          h,
          end - 1,
          input.sampling,
          0,
          allowedIds(input.tokenMask, this.config.vocabSize),
        )
        : fakeDraw(h, end - 1, input.sampling, this.config.vocabSize, this.#opts.outputIds);
      this.#lastSampled.set(input.seqId, token);
      sampled.push({ seqId: input.seqId, token, logprob: fakeLogprob(h) });
    }
    return { stepId: plan.stepId, sampled, ...(hidden.length > 0 ? { hidden } : {}) };
  }

  /** Hidden rows of an input: each row's dim values drawn from its position's chain hash. */
  #hidden(input: SeqInput, n: number, chainTo: (end: number) => number): HiddenStates {
    const { dim } = this.config;
    const keep = input.hidden === "all" ? n : 1;
    const first = input.startPos + n - keep;
    const rows = new Float32Array(keep * dim);
    for (let r = 0; r < keep; r++) {
      const h = chainTo(first + r + 1);
      for (let j = 0; j < dim; j++) rows[r * dim + j] = fakeChain(h, j, first + r) / 2 ** 32 - 0.5;
    }
    return { seqId: input.seqId, startPos: first, rows };
  }

  /** Forgets the sequence's last sampled token: a later useLastSampled for it is an error. */
  release(seqId: number): void {
    this.#lastSampled.delete(seqId);
    this.released++;
  }

  dispose(): void {
    this.#disposed = true;
  }
}
