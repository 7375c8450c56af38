import { setImmediate } from "node:timers";
import type {
  Engine,
  HiddenStates,
  KvGeometry,
  SampledToken,
  StepPlan,
  StepResult,
} from "../../lib/engine/engine.ts";
import { validateStep } from "../../lib/engine/step_validation.ts";
import { type ModelConfig, ropeFrequencies } from "../../lib/model/model_config.ts";
import { logSoftmaxAt, sample } from "../../lib/engine/sampling.ts";
import { applyLogitAdjust } from "../../lib/engine/logit_adjust.ts";
import { topLogprobs } from "../../lib/engine/top_logprobs.ts";
import { maskLogits } from "../../lib/engine/token_mask.ts";

/**
 * A masked draw reports its token's logprob under the row before the mask (after any logit
 * adjustments), as an unmasked one does.
 */
function rawLogprob(logits: Float32Array, token: number): { token: number; logprob: number } {
  return { token, logprob: logSoftmaxAt(logits, token) };
}
import type { ModelWeights } from "../../lib/model/weights.ts";
import { type DenseLayer, type DenseWeights, denseWeights } from "./dense_weights.ts";
import { addInPlace, headRmsnorm, matvec, rmsnorm, ropeWithFrequencies, swiglu } from "./ops.ts";
import { pagedAttention } from "./paged_attention.ts";
import { PagedKvCache } from "./paged_kv_cache.ts";

/**
 * The dense (f32) copies of a model's weights, made once per weights object: they are only
 * read, so every engine over the same model (a rebuilt one after a fault, a test's second
 * engine) shares them instead of holding its own.
 */
const denseCache = new WeakMap<ModelWeights, { config: ModelConfig; dense: DenseWeights }>();
function sharedDenseWeights(config: ModelConfig, weights: ModelWeights): DenseWeights {
  const hit = denseCache.get(weights);
  if (hit !== undefined && hit.config === config) return hit.dense;
  const dense = denseWeights(config, weights);
  denseCache.set(weights, { config, dense });
  return dense;
}

/**
 * The CPU reference engine: the whole Llama forward pass in plain TypeScript over f32 weights
 * (dequantized once here), with the same paged KV cache and step API as the GPU engine. It runs
 * every new token of every sequence one at a time, in plan order, which is what a batched,
 * chunked forward must reproduce. It is the oracle for GPU work, so it favours obviousness over
 * speed.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { GREEDY } from "../../lib/engine/engine.ts";
 * import { loadModel } from "../../lib/model/load_model.ts";
 *
 * const model = await loadModel("stories260K.bin");
 * const engine = new CpuEngine(model.config, model.weights, { numBlocks: 64, blockSize: 16 });
 * // Prefill BOS and "Once" at positions 0 and 1 of KV block 0, and sample what follows.
 * const r = await engine.step({ stepId: 0, seqs: [{ seqId: 1, tokens: [1, 403], startPos: 0,
 *   blockTable: [0], sample: true, sampling: GREEDY }] });
 * assertEquals(r.sampled.map((s) => [s.seqId, s.token]), [[1, 407]]); // " upon"
 * engine.dispose();
 * ```
 */
export class CpuEngine implements Engine {
  readonly name = "cpu";
  readonly kv: KvGeometry;
  readonly hiddenStates = true;
  /** Bytes of host memory held: the weights expanded to f32, and the KV cache. */
  readonly memory: { readonly weights: number; readonly kvCache: number };
  private readonly dense: DenseWeights;
  private readonly ropeFreqs: Float64Array;
  private readonly cache: PagedKvCache;
  /** The token each sequence sampled last, input to a `useLastSampled` decode. */
  private readonly lastSampled = new Map<number, number>();
  /** Steps run strictly one after another, in call order. */
  private queue: Promise<unknown> = Promise.resolve();
  private disposed = false;

  constructor(readonly config: ModelConfig, weights: ModelWeights, kv: KvGeometry) {
    if (config.nHeads % config.nKvHeads !== 0) {
      throw new Error(
        `Cannot create CPU engine: nHeads ${config.nHeads} must be a multiple of nKvHeads ${config.nKvHeads}`,
      );
    }
    this.kv = { numBlocks: kv.numBlocks, blockSize: kv.blockSize };
    this.dense = sharedDenseWeights(config, weights);
    this.ropeFreqs = ropeFrequencies(config);
    this.cache = new PagedKvCache(config.nLayers, config.nKvHeads, config.headDim, this.kv);
    const d = this.dense;
    const arrays = new Set<Float32Array>([d.tokenEmbedding, d.output, d.outputNorm]);
    for (const l of d.layers) {
      for (const a of Object.values(l)) {
        if (a instanceof Float32Array) arrays.add(a);
        else for (const b of Object.values(a as Record<string, Float32Array>)) arrays.add(b);
      }
    }
    this.memory = {
      weights: [...arrays].reduce((n, a) => n + a.byteLength, 0),
      kvCache: 2 * config.nLayers * kv.numBlocks * kv.blockSize * config.nKvHeads *
        config.headDim * 4,
    };
  }

  /**
   * Runs the step after one turn of the event loop. The forward pass is synchronous, and steps
   * chained as promise callbacks would otherwise run back to back as one unbroken string of
   * microtasks: a busy server would serve no socket, timer or signal (no token reaches a client,
   * no request is admitted, SIGTERM waits) until it ran out of work. setImmediate costs
   * microseconds, not the millisecond or more of setTimeout(0).
   */
  step(plan: StepPlan): Promise<StepResult> {
    const result = this.queue.then(nextTurn).then(() => this.runStep(plan));
    this.queue = result.catch(() => {});
    return result;
  }

  /**
   * Forgets the sequence's last sampled token. Queued like a step: a step accepted earlier but
   * not yet run may still sample for it, and would otherwise leave an entry behind for good.
   */
  release(seqId: number): void {
    this.queue = this.queue.then(() => this.lastSampled.delete(seqId));
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.lastSampled.clear();
    this.cache.release();
  }

  private runStep(plan: StepPlan): StepResult {
    if (this.disposed) {
      throw new Error(`Cannot run step ${plan.stepId}: the CPU engine was disposed`);
    }
    // Check the whole plan before touching the cache, so a bad plan changes nothing.
    const inputs = this.resolveInputs(plan);
    if (plan.kvCopies) this.cache.copyBlocks(plan.kvCopies);
    const sampled: SampledToken[] = [];
    const hidden: HiddenStates[] = [];
    plan.seqs.forEach((seq, i) => {
      const tokens = inputs[i]!;
      const { dim } = this.config;
      const keepFrom = seq.hidden === "all" ? 0 : tokens.length - 1;
      const rows = seq.hidden ? new Float32Array((tokens.length - keepFrom) * dim) : undefined;
      let x: Float32Array | undefined;
      tokens.forEach((token, j) => {
        x = this.forward(token, seq.startPos + j, seq.blockTable);
        if (rows && j >= keepFrom) rows.set(this.finalNorm(x), (j - keepFrom) * dim);
      });
      if (rows) hidden.push({ seqId: seq.seqId, startPos: seq.startPos + keepFrom, rows });
      if (!seq.sample) return;
      const position = seq.startPos + tokens.length;
      const logits = applyLogitAdjust(this.logitsOf(x!), seq.adjust);
      const mask = seq.tokenMask;
      const { token, logprob } = mask
        ? rawLogprob(logits, sample(maskLogits(logits, mask), seq.sampling, position).token)
        : sample(logits, seq.sampling, position);
      this.lastSampled.set(seq.seqId, token);
      sampled.push({
        seqId: seq.seqId,
        token,
        logprob,
        ...(plan.returnLogits ? { logits } : {}),
        ...(seq.topLogprobs ? { top: topLogprobs(logits, seq.topLogprobs) } : {}),
      });
    });
    return { stepId: plan.stepId, sampled, ...(hidden.length > 0 ? { hidden } : {}) };
  }

  private resolveInputs(plan: StepPlan): number[][] {
    validateStep(plan, {
      config: this.config,
      kv: this.kv,
      hasLastSampled: (seqId) => this.lastSampled.has(seqId),
      hiddenStates: true,
    });
    return plan.seqs.map((seq) =>
      seq.useLastSampled ? [this.lastSampled.get(seq.seqId)!] : [...seq.tokens]
    );
  }

  /** A row's hidden state after the final norm (a fresh array). */
  private finalNorm(x: Float32Array): Float32Array {
    const out = new Float32Array(x.length);
    rmsnorm(out, x, this.dense.outputNorm, this.config.rmsEps);
    return out;
  }

  /** The logits of a row: the classifier over its final norm (the largest matmul). */
  private logitsOf(x: Float32Array): Float32Array {
    return matvec(new Float32Array(this.config.vocabSize), this.dense.output, this.finalNorm(x));
  }

  /**
   * One token through every layer: writes its K/V at its slot and attends over positions
   * 0..pos. Returns the row's residual stream after the last layer (before the final norm).
   */
  private forward(token: number, pos: number, blockTable: readonly number[]): Float32Array {
    const { dim, hiddenDim, nHeads, nKvHeads, headDim, rmsEps } = this.config;
    const x = this.dense.tokenEmbedding.slice(token * dim, (token + 1) * dim);
    const xb = new Float32Array(dim);
    const q = new Float32Array(nHeads * headDim);
    const k = new Float32Array(nKvHeads * headDim);
    const v = new Float32Array(nKvHeads * headDim);
    const att = new Float32Array(nHeads * headDim);
    const gate = new Float32Array(hiddenDim);
    const up = new Float32Array(hiddenDim);
    const slot = this.cache.slotOffset(blockTable, pos);

    this.dense.layers.forEach((w: DenseLayer, l) => {
      rmsnorm(xb, x, w.attnNorm, rmsEps);
      matvec(q, w.wq, xb);
      matvec(k, w.wk, xb);
      matvec(v, w.wv, xb);
      // The architecture's optional steps (config.steps): biases, then per-head norms, then RoPE.
      if (w.bias) {
        addInPlace(q, w.bias.q);
        addInPlace(k, w.bias.k);
        addInPlace(v, w.bias.v);
      }
      if (w.headNorm) {
        headRmsnorm(q, nHeads, w.headNorm.q, rmsEps);
        headRmsnorm(k, nKvHeads, w.headNorm.k, rmsEps);
      }
      ropeWithFrequencies(q, nHeads, headDim, this.ropeFreqs, pos);
      ropeWithFrequencies(k, nKvHeads, headDim, this.ropeFreqs, pos);
      this.cache.key(l).set(k, slot);
      this.cache.value(l).set(v, slot);
      pagedAttention(att, q, this.cache, l, blockTable, pos, nHeads);
      addInPlace(x, matvec(xb, w.wo, att));

      rmsnorm(xb, x, w.ffnNorm, rmsEps);
      matvec(gate, w.wGate, xb);
      matvec(up, w.wUp, xb);
      addInPlace(x, matvec(xb, w.wDown, swiglu(gate, up)));
    });

    return x;
  }
}

/** Resolves after the event loop has had a turn (I/O, timers, signals). */
function nextTurn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}
