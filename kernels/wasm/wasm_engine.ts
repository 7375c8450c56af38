import {
  type Engine,
  type KvCopy,
  type KvGeometry,
  type SampledToken,
  type StepPlan,
  type StepResult,
  stepTokens,
} from "../../lib/engine/engine.ts";
import type { StageLink, StageOutput } from "../../lib/engine/stage_link.ts";
import { validateStep } from "../../lib/engine/step_validation.ts";
import { type ModelConfig, ropeFrequencies } from "../../lib/model/model_config.ts";
import type { Tensor } from "../../lib/model/tensor.ts";
import { byteSize, TENSOR_TYPES } from "../../lib/model/tensor.ts";
import type { ModelWeights } from "../../lib/model/weights.ts";
import { dequantize } from "../../lib/model/dequantize.ts";
import { DEFAULT_LIMITS } from "../../lib/engine/limits.ts";
import { WasmHeap, wasmHeap } from "./heap.ts";
import { heldLayers } from "./tensor_placement.ts";
import { checkLayerRange } from "./stage_placement.ts";
import { ThreadPool } from "./pool.ts";
import {
  EnginePart,
  LOGIT_ROWS,
  partOverheadBytes,
  type PartShape,
  scoreBytes,
  scoreRows,
} from "./engine_part.ts";
import { type LayerRange, splitLayers, type SplitUnit } from "./layer_split.ts";
import { ATTENTION_GROUP, f32Bits, OP, OP_WORDS, ProgramWriter } from "./program.ts";
import { type KernelFlavour, kernelModule } from "./kernel_module.ts";
import type { LayerPtrs, Matrix } from "./layer_ptrs.ts";
import {
  packColumns,
  rowSlice,
  scatterColumns,
  type TpExchange,
  type TpShard,
  tpShard,
} from "./tp_shard.ts";
import { ActBuffer } from "./act_buffer.ts";
import { writeQkv } from "./qkv_program.ts";
import {
  gatherTarget,
  TP_GATHERS_PER_LAYER,
  type TpLayerContext,
  writeTpSegment,
} from "./tp_program.ts";
import { sampleRow, samplesArgmax } from "../../lib/engine/sample_row.ts";
import { sampleMaskedRow } from "./masked_sampling.ts";
import { tokenMaskProblem } from "../../lib/engine/token_mask.ts";
import { checkParams } from "../../lib/engine/sampling.ts";
import { applyLogitAdjust } from "../../lib/engine/logit_adjust.ts";
import { topLogprobs } from "../../lib/engine/top_logprobs.ts";
import { finalNormRows } from "../../lib/engine/final_norm.ts";

/** How the CPU engine is built. */
export interface WasmEngineOptions {
  /** Worker threads; default: the machine's cores. */
  readonly threads?: number;
  readonly maxBatchTokens?: number;
  readonly maxSeqs?: number;
  /** KV cache element type; f16 halves its memory. */
  readonly kvDtype?: "f16" | "f32";
  /** Kernel build; default: relaxed SIMD where the runtime has it. */
  readonly flavour?: KernelFlavour;
  /**
   * The most one of the engine's WebAssembly memories may hold (default and most: 4 GiB).
   * Given, the engine splits the layers over fresh memories of this size, copying the weights
   * there: how tests make a small model run split.
   */
  readonly memoryBytes?: number;
  /**
   * Run only layers [start, end) (default: all): a pipeline stage (stage_engine.ts). Only their
   * weights are read, only their KV cache is held; the embedding is read on the first stage,
   * the output norm and classifier on the last.
   */
  readonly layers?: LayerRange;
  /**
   * Run as rank `shard.rank` of a tensor-parallel group (tp_shard.ts): only the shard's rows of
   * each layer matrix and its KV heads are used, and each layer's four gathers go through
   * `exchange`. Rank 0 holds the classifier and samples; the others answer empty rows.
   */
  readonly tensorParallel?: { readonly shard: TpShard; readonly exchange: TpExchange };
}

/** Weights already placed in a heap, per tensor: shared by every engine over the model. */
const placedIn = new WeakMap<WasmHeap, WeakMap<Tensor, number>>();
function placed(heap: WasmHeap): WeakMap<Tensor, number> {
  let m = placedIn.get(heap);
  if (!m) placedIn.set(heap, m = new WeakMap());
  return m;
}

/** Row statistics that say "do not hold" (their flag word set): for a row changed after them. */
const NO_ROW_STATS = new Int32Array([0, 0, 0, 1]);

/**
 * The CPU engine: the forward pass as WebAssembly SIMD kernels (kernels/wasm/as/) over weights
 * kept in their file encoding, run by a pool of threads that split every matmul's output rows.
 * Same step API, paged KV cache and validation as the other engines. A step's results do not
 * depend on which sequences share it or on the thread count: every output element is reduced
 * in one fixed order.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { GREEDY } from "../../lib/engine/engine.ts";
 * import { loadModel } from "../../lib/model/load_model.ts";
 *
 * const model = await loadModel("stories260K.bin");
 * const kv = { numBlocks: 64, blockSize: 16 };
 * const engine = await WasmEngine.create(model.config, model.weights, kv, { threads: 2 });
 * // BOS and "Once" into KV block 0; greedy picks " upon", as the reference engine does.
 * const r = await engine.step({ stepId: 0, seqs: [{ seqId: 1, tokens: [1, 403], startPos: 0,
 *   blockTable: [0], sample: true, sampling: GREEDY }] });
 * assertEquals(r.sampled[0]?.token, 407);
 * engine.dispose();
 * ```
 */
export class WasmEngine implements Engine, StageLink {
  readonly name = "cpu";
  readonly hiddenStates = true;
  /** Its sampling runs on this thread after the forward pass: a late mask is awaited there. */
  readonly lateMasks = true;
  readonly resultsOnHost = true;
  readonly kv: KvGeometry;
  readonly limits: { readonly maxSeqs: number; readonly maxBatchTokens: number };
  readonly memory: {
    readonly weights: number;
    readonly kvCache: number;
    readonly buffers: number;
    /** KV bytes of the blocks written so far: the part of the reservation made resident. */
    readonly kvResident: number;
  };
  readonly threads: number;
  readonly flavour: KernelFlavour;
  readonly kvDtype: "f16" | "f32";
  /** WebAssembly memories the layers are split over (1 unless the model needs more than 4 GiB). */
  readonly memories: number;
  /** The layers this engine runs: all of them, or a pipeline stage's range. */
  readonly stage: LayerRange;

  // Notes a KV block a step writes: the cache's pages become resident only then.
  readonly #markWritten: (block: number) => void;
  readonly #pool: ThreadPool;
  /** One per memory, in layer order: the model's layers split by range. */
  readonly #parts: EnginePart[];
  /** Per layer, in model order (undefined outside the stage's range). */
  readonly #layers: (LayerPtrs | undefined)[];
  /** The classifier, on the last stage only. */
  readonly #output: Matrix | undefined;
  readonly #outputNorm: number;
  readonly #embedding: Tensor;
  readonly #embedRowBytes: number;
  readonly #freqs: Float64Array;
  readonly #tableCap: number;
  /** Set on a tensor-parallel rank: its shard, every rank's, its exchange and its SwiGLU rows. */
  readonly #tp:
    | { shard: TpShard; all: TpShard[]; exchange: TpExchange; hidden: ActBuffer }
    | undefined;
  readonly #lastSampled = new Map<number, number>();
  #queue: Promise<unknown> = Promise.resolve();
  #disposed = false;

  private constructor(
    readonly config: ModelConfig,
    weights: ModelWeights,
    kv: KvGeometry,
    pool: ThreadPool,
    split: { ranges: LayerRange[]; heaps: WasmHeap[]; shape: PartShape },
    opts: WasmEngineOptions & { flavour: KernelFlavour },
  ) {
    const { dim, hiddenDim, nHeads, nKvHeads, headDim, vocabSize, nLayers } = config;
    this.kv = { numBlocks: kv.numBlocks, blockSize: kv.blockSize };
    this.#pool = pool;
    this.threads = pool.threads;
    this.flavour = opts.flavour;
    this.kvDtype = opts.kvDtype ?? "f16";
    const { maxRows, maxSeqs, tableCap } = split.shape;
    this.limits = { maxSeqs, maxBatchTokens: maxRows };
    this.#tableCap = tableCap;
    this.#freqs = ropeFrequencies(config);
    this.#embedding = weights.tokenEmbedding;
    this.#embedRowBytes = byteSize(weights.tokenEmbedding.type, [config.dim]);
    this.memories = split.heaps.length;
    const stage = this.stage = opts.layers ?? { start: 0, end: nLayers };
    const isLast = stage.end === nLayers;

    const qDim = nHeads * headDim, kvDim = nKvHeads * headDim;
    let weightBytes = 0;
    const vector = (heap: WasmHeap, t: Tensor | undefined, n: number): number => {
      if (!t) return 0;
      weightBytes += n * 4;
      const hit = placed(heap).get(t);
      if (hit !== undefined) return hit;
      const values = dequantize(t);
      if (values.length !== n) {
        throw new Error(
          `Cannot build the CPU engine: '${t.name}' has ${values.length} values, expected ${n}`,
        );
      }
      const p = heap.alloc(n * 4, `'${t.name}'`);
      heap.f32(p, n).set(values);
      placed(heap).set(t, p);
      return p;
    };
    const matrix = (heap: WasmHeap, t: Tensor, rows: number, cols: number): Matrix => {
      if (t.shape.length !== 2 || t.shape[0] !== rows || t.shape[1] !== cols) {
        throw new Error(
          `Cannot build the CPU engine: '${t.name}' has shape [${
            t.shape.join(", ")
          }], expected [${rows}, ${cols}]`,
        );
      }
      const type = TENSOR_TYPES.indexOf(t.type);
      const bytes = byteSize(t.type, t.shape);
      weightBytes += bytes;
      let ptr = placed(heap).get(t);
      if (ptr === undefined) {
        if (heap.owns(t.data)) {
          ptr = t.data.byteOffset;
        } else {
          // Tensors made at load (neox Q/K rows reordered), read into ordinary memory or into
          // another part's memory.
          ptr = heap.alloc(bytes, `'${t.name}'`);
          heap.u8(ptr, bytes).set(t.data.subarray(0, bytes));
        }
        placed(heap).set(t, ptr);
      }
      return { type, ptr, rows, cols };
    };
    if (weights.layers.length !== nLayers) {
      throw new Error(
        `Cannot build the CPU engine: config says ${nLayers} layers, weights hold ${weights.layers.length}`,
      );
    }
    const heapOf = (layer: number) => split.heaps[split.ranges.findIndex((r) => layer < r.end)]!;
    const shard = opts.tensorParallel?.shard;
    this.#layers = weights.layers.map((l, i) => {
      if (i < stage.start || i >= stage.end) return undefined;
      const h = heapOf(i);
      if (shard) return this.#shardLayer(h, l, shard, vector, matrix);
      return {
        attnNorm: vector(h, l.attnNorm, dim),
        ffnNorm: vector(h, l.ffnNorm, dim),
        wq: matrix(h, l.wq, qDim, dim),
        wk: matrix(h, l.wk, kvDim, dim),
        wv: matrix(h, l.wv, kvDim, dim),
        wo: matrix(h, l.wo, dim, qDim),
        wGate: matrix(h, l.wGate, hiddenDim, dim),
        wUp: matrix(h, l.wUp, hiddenDim, dim),
        wDown: matrix(h, l.wDown, dim, hiddenDim),
        qBias: vector(h, l.qBias, qDim),
        kBias: vector(h, l.kBias, kvDim),
        vBias: vector(h, l.vBias, kvDim),
        qNorm: vector(h, l.qNorm, headDim),
        kNorm: vector(h, l.kNorm, headDim),
      };
    });
    const lastHeap = split.heaps[split.heaps.length - 1]!;
    const samples = isLast && (shard?.rank ?? 0) === 0;
    this.#output = samples ? matrix(lastHeap, weights.output, vocabSize, dim) : undefined;
    // The embedding is read in place row by row; a tied one is the classifier, counted above.
    const tied = weights.output === weights.tokenEmbedding;
    if (stage.start === 0 && !(isLast && tied)) {
      weightBytes += byteSize(weights.tokenEmbedding.type, weights.tokenEmbedding.shape);
    }
    this.#outputNorm = isLast ? vector(lastHeap, weights.outputNorm, dim) : 0;

    const kvHeads = shard ? shard.kvHeads.end - shard.kvHeads.start : nKvHeads;
    const kvLayerBytes = kvLayerBytesOf({ ...config, nKvHeads: kvHeads }, kv, this.kvDtype);
    this.#parts = [];
    try {
      split.ranges.forEach((r, i) => {
        const last = isLast && i === split.ranges.length - 1;
        this.#parts.push(
          new EnginePart(split.heaps[i]!, i, r.start, r.end, split.shape, kvLayerBytes, last),
        );
      });
    } catch (e) {
      for (const p of this.#parts) p.free();
      throw e;
    }
    if (shard) {
      const hl = shard.hiddenRows.end - shard.hiddenRows.start;
      const hidden = new ActBuffer(split.heaps[0]!, maxRows, hl, "tensor-parallel hidden rows");
      const all = Array.from({ length: shard.size }, (_, r) => tpShard(config, r, shard.size));
      this.#tp = { shard, all, exchange: opts.tensorParallel!.exchange, hidden };
    }
    const kvBytes = this.#parts.reduce((n, p) => n + p.kvBytes, 0);
    const blockBytes = kvBytes / kv.numBlocks;
    const written = new Uint8Array(kv.numBlocks);
    let blocks = 0;
    this.#markWritten = (b) => {
      if (written[b] === 0) (written[b] = 1, blocks++);
    };
    this.memory = {
      weights: weightBytes,
      kvCache: kvBytes,
      buffers: this.#parts.reduce((n, p) => n + p.bufferBytes, this.#tp?.hidden.bytes ?? 0),
      get kvResident() {
        return blocks * blockBytes;
      },
    };
  }

  /**
   * A tensor-parallel rank's part of a layer: its query and KV heads' rows of wq, wk, wv (and
   * biases), its residual columns' rows of wo and wDown, its hidden columns' rows of wGate and
   * wUp. Row slices are views of the tensors' bytes, so nothing is copied where they lie in
   * the engine's memory.
   */
  #shardLayer(
    h: WasmHeap,
    l: ModelWeights["layers"][number],
    s: TpShard,
    vector: (heap: WasmHeap, t: Tensor | undefined, n: number) => number,
    matrix: (heap: WasmHeap, t: Tensor, rows: number, cols: number) => Matrix,
  ): LayerPtrs {
    const { dim, hiddenDim, nHeads, nKvHeads, headDim } = this.config;
    const q = { start: s.heads.start * headDim, end: s.heads.end * headDim };
    const k = { start: s.kvHeads.start * headDim, end: s.kvHeads.end * headDim };
    const rows = (t: Tensor, r: { start: number; end: number }, cols: number) =>
      matrix(h, rowSlice(t, r.start, r.end), r.end - r.start, cols);
    const at = (ptr: number, from: number) => (ptr === 0 ? 0 : ptr + from * 4);
    return {
      attnNorm: vector(h, l.attnNorm, dim),
      ffnNorm: vector(h, l.ffnNorm, dim),
      wq: rows(l.wq, q, dim),
      wk: rows(l.wk, k, dim),
      wv: rows(l.wv, k, dim),
      wo: rows(l.wo, s.dimRows, nHeads * headDim),
      wGate: rows(l.wGate, s.hiddenRows, dim),
      wUp: rows(l.wUp, s.hiddenRows, dim),
      wDown: rows(l.wDown, s.dimRows, hiddenDim),
      qBias: at(vector(h, l.qBias, nHeads * headDim), q.start),
      kBias: at(vector(h, l.kBias, nKvHeads * headDim), k.start),
      vBias: at(vector(h, l.vBias, nKvHeads * headDim), k.start),
      qNorm: vector(h, l.qNorm, headDim),
      kNorm: vector(h, l.kNorm, headDim),
    };
  }

  /** Builds the engine: places the weights, allocates the KV cache and starts the threads. */
  static async create(
    config: ModelConfig,
    weights: ModelWeights,
    kv: KvGeometry,
    opts: WasmEngineOptions = {},
  ): Promise<WasmEngine> {
    if (config.nHeads % config.nKvHeads !== 0) {
      throw new Error(
        `Cannot create the CPU engine: nHeads ${config.nHeads} must be a multiple of nKvHeads ${config.nKvHeads}`,
      );
    }
    if (config.headDim % 8 !== 0) {
      throw new Error(
        `Cannot create the CPU engine: head size ${config.headDim} must be a multiple of 8`,
      );
    }
    const { module, flavour } = kernelModule(opts.flavour);
    const threads = opts.threads ?? navigator.hardwareConcurrency;
    const maxRows = opts.maxBatchTokens ?? DEFAULT_LIMITS.maxBatchTokens;
    const maxSeqs = opts.maxSeqs ?? DEFAULT_LIMITS.maxRunning;
    const shape: PartShape = {
      config,
      maxRows,
      maxSeqs,
      threads,
      tableCap: maxSeqs * Math.min(kv.numBlocks, Math.ceil(config.contextLength / kv.blockSize)),
    };
    if (opts.layers) checkLayerRange(opts.layers, config.nLayers, "the CPU engine");
    const split = splitModel(config, weights, kv, shape, opts);
    if (opts.tensorParallel && (opts.layers || split.heaps.length > 1)) {
      throw new Error(
        "Cannot create a tensor-parallel CPU engine rank over a layer range or several memories: " +
          "not built yet (a rank runs every layer in one memory)",
      );
    }
    const pool = await ThreadPool.start(split.heaps, module, threads);
    try {
      return new WasmEngine(config, weights, kv, pool, { ...split, shape }, { ...opts, flavour });
    } catch (e) {
      pool.close();
      throw e;
    }
  }
  step(plan: StepPlan): Promise<StepResult> {
    if (this.#tp) {
      return Promise.reject(
        new Error(
          `Cannot run step ${plan.stepId} alone: this CPU engine is tensor-parallel rank ` +
            `${this.#tp.shard.rank} of ${this.#tp.shard.size}; its group steps together (TensorParallelEngine)`,
        ),
      );
    }
    if (this.stage.start !== 0 || this.stage.end !== this.config.nLayers) {
      return Promise.reject(
        new Error(
          `Cannot run step ${plan.stepId} whole: this CPU engine is a pipeline stage of layers ` +
            `${this.stage.start}-${this.stage.end} of ${this.config.nLayers}; use stepStage()`,
        ),
      );
    }
    return this.stepStage(plan).then((out) => (out as { result: StepResult }).result);
  }

  /**
   * One step of this engine's layers. The first stage embeds the plan's tokens; a later one
   * takes `input`, the residual rows the stage before returned (stepTokens(plan) × dim f32).
   * The last stage samples and returns the step's result, a stage before it its residual rows.
   * A plan for a stage that does not sample has no `useLastSampled` input: whoever chains the
   * stages sends the token (pipeline_engine.ts).
   */
  stepStage(plan: StepPlan, input?: Float32Array): Promise<StageOutput> {
    const result = this.#queue.then(() => this.#runStep(plan, input));
    this.#queue = result.catch(() => {});
    return result;
  }

  release(seqId: number): void {
    this.#queue = this.#queue.then(() => this.#lastSampled.delete(seqId));
  }

  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    this.#pool.close();
    // Freed after the queue drains: a step in flight still reads these buffers.
    this.#queue.finally(() => {
      for (const p of this.#parts) p.free();
      this.#tp?.hidden.free();
    });
    this.#lastSampled.clear();
  }

  async #runStep(plan: StepPlan, input: Float32Array | undefined): Promise<StageOutput> {
    if (this.#disposed) {
      throw new Error(`Cannot run step ${plan.stepId}: the CPU engine was disposed`);
    }
    const { config } = this;
    const { dim } = config;
    const bs = this.kv.blockSize;
    validateStep(plan, {
      config,
      kv: this.kv,
      hasLastSampled: (id) => this.#lastSampled.has(id),
      hiddenStates: true,
      capacity: {
        maxRows: this.limits.maxBatchTokens,
        maxSeqs: this.limits.maxSeqs,
        maxTableEntries: this.#tableCap,
      },
    });
    this.#checkInput(plan, input);
    const first = this.#parts[0]!, last = this.#parts[this.#parts.length - 1]!;
    const heap = first.heap;
    if (plan.kvCopies) this.#copyBlocks(plan.kvCopies);
    const maxRows = this.limits.maxBatchTokens;
    const ints = heap.i32(first.rowInts, 4 * maxRows);
    const positions = ints.subarray(0, maxRows);
    const slots = ints.subarray(maxRows, 2 * maxRows);
    const tableOffs = ints.subarray(2 * maxRows, 3 * maxRows);
    const rowmap = ints.subarray(3 * maxRows, 4 * maxRows);
    const tables = heap.i32(first.tables, this.#tableCap);
    const x = heap.f32(first.x, maxRows * dim);
    const pairs = config.ropeDim / 2;
    const rope = heap.f32(first.rope, maxRows * pairs * 2);

    let rows = 0, tableAt = 0;
    const sampling: { seq: number; row: number }[] = [];
    const hiddenAt: { seqId: number; startPos: number; from: number; to: number }[] = [];
    plan.seqs.forEach((seq, i) => {
      const from = rows;
      const tokens = seq.useLastSampled ? [this.#lastSampled.get(seq.seqId)!] : seq.tokens;
      const needed = Math.ceil((seq.startPos + tokens.length) / bs);
      for (let t = 0; t < needed; t++) tables[tableAt + t] = seq.blockTable[t]!;
      tokens.forEach((token, j) => {
        const pos = seq.startPos + j;
        positions[rows] = pos;
        const block = seq.blockTable[Math.floor(pos / bs)]!;
        this.#markWritten(block);
        slots[rows] = block * bs + (pos % bs);
        tableOffs[rows] = tableAt;
        if (!input) this.#embed(token, x.subarray(rows * dim, (rows + 1) * dim));
        for (let p = 0; p < pairs; p++) {
          const angle = pos * this.#freqs[p]!;
          rope[(rows * pairs + p) * 2] = Math.cos(angle);
          rope[(rows * pairs + p) * 2 + 1] = Math.sin(angle);
        }
        rows++;
      });
      tableAt += needed;
      if (seq.hidden) {
        const keep = seq.hidden === "all" ? rows - from : 1;
        const startPos = seq.startPos + tokens.length - keep;
        hiddenAt.push({ seqId: seq.seqId, startPos, from: rows - keep, to: rows });
      }
      if (seq.sample) {
        rowmap[sampling.length] = rows - 1;
        sampling.push({ seq: i, row: rows - 1 });
      }
    });

    if (input) x.set(input);
    const isLast = this.stage.end === config.nLayers;
    const samples = isLast && this.#output !== undefined;
    if (this.#tp) await this.#runShard(rows, samples ? sampling.length : 0);
    else await this.#runLayers(rows, isLast ? sampling.length : 0, tableAt);
    // A tensor-parallel rank other than 0 has nothing to send: rank 0 holds the same rows.
    if (isLast && !samples) return { kind: "rows", rows: new Float32Array(0) };
    if (!isLast) return { kind: "rows", rows: last.heap.f32(last.x, rows * dim).slice() };
    const hidden = hiddenAt.map(({ seqId, startPos, from, to }) => ({
      seqId,
      startPos,
      rows: this.#finalNorm(last, from, to),
    }));
    const sampled = await this.#sample(plan, sampling, last);
    const result = { stepId: plan.stepId, sampled, ...(hidden.length > 0 ? { hidden } : {}) };
    return { kind: "result", result };
  }

  /** A stage's input rows: none on the first (it embeds), stepTokens(plan) × dim on the others. */
  #checkInput(plan: StepPlan, input: Float32Array | undefined): void {
    const want = this.stage.start === 0 ? 0 : stepTokens(plan) * this.config.dim;
    const got = input?.length ?? 0;
    if (want === 0 ? input !== undefined : got !== want) {
      throw new Error(
        `Invalid input rows for step ${plan.stepId} on the stage of layers ` +
          `${this.stage.start}-${this.stage.end}: expected ${
            want === 0 ? "none (the first stage embeds the tokens)" : `${want} f32 values`
          }, received ${input === undefined ? "none" : `${got} values`}`,
      );
    }
  }

  /** Samples the planned rows from the last part's classifier rows, LOGIT_ROWS at a time. */
  async #sample(
    plan: StepPlan,
    sampling: readonly { seq: number; row: number }[],
    last: EnginePart,
  ): Promise<SampledToken[]> {
    const { vocabSize } = this.config;
    const sampled: SampledToken[] = [];
    let masks: (Uint32Array | undefined)[] | undefined;
    for (let c = 0; c < sampling.length; c += LOGIT_ROWS) {
      const n = Math.min(LOGIT_ROWS, sampling.length - c);
      last.actOut!.writeOffsetDesc(last.chunkDesc, c);
      const w = new ProgramWriter(last.heap.i32(last.prog, last.progOps * OP_WORDS));
      const o = this.#output!;
      w.op(OP.matmul, [
        o.type,
        o.ptr,
        o.rows,
        o.cols,
        last.chunkDesc,
        n,
        last.logits,
        vocabSize,
        0,
        0,
      ]);
      w.op(OP.rowStats, [last.logits, n, vocabSize, last.stats]);
      w.end();
      await this.#pool.run(last.prog, last.mem);
      // Late masks were computed while the layers and the first logits ran.
      masks ??= await this.#masks(plan);
      const logits = last.heap.f32(last.logits, n * vocabSize);
      const stats = last.heap.i32(last.stats, n * 4), statsF = last.heap.f32(last.stats, n * 4);
      for (let r = 0; r < n; r++) {
        const { seq: i } = sampling[c + r]!;
        const seq = plan.seqs[i]!;
        const raw = logits.subarray(r * vocabSize, (r + 1) * vocabSize);
        const row = applyLogitAdjust(raw, seq.adjust);
        const position = seq.startPos + (seq.useLastSampled ? 1 : seq.tokens.length);
        // Greedy rows take the threads' argmax and normaliser, which are the raw row's (a row
        // with a NaN or an infinite logit, or an adjusted one, goes the general way).
        const greedy = samplesArgmax(seq.sampling);
        const rawStats = row === raw;
        const mask = masks[i];
        const { token, logprob } = mask
          ? sampleMaskedRow(
            row,
            seq.sampling,
            position,
            mask,
            greedy,
            rawStats ? stats : NO_ROW_STATS,
            statsF,
            rawStats ? r : 0,
          )
          : greedy && rawStats && stats[r * 4 + 3] === 0
          ? (checkParams(seq.sampling, vocabSize),
            { token: stats[r * 4]!, logprob: -Math.log(statsF[r * 4 + 2]!) })
          : sampleRow(row, seq.sampling, position);
        this.#lastSampled.set(seq.seqId, token);
        sampled.push({
          seqId: seq.seqId,
          token,
          logprob,
          ...(plan.returnLogits ? { logits: row.slice() } : {}),
          ...(seq.topLogprobs ? { top: topLogprobs(row, seq.topLogprobs) } : {}),
        });
      }
    }
    return sampled;
  }

  /**
   * Rows [from, to) of the last part's residual stream after the final norm, as llama.cpp
   * pools them into embeddings: RMS norm in float64 sums, times the output norm's weights.
   */
  #finalNorm(last: EnginePart, from: number, to: number): Float32Array {
    const { dim, rmsEps } = this.config;
    const x = last.heap.f32(last.x + from * dim * 4, (to - from) * dim);
    return finalNormRows(x, last.heap.f32(this.#outputNorm, dim), rmsEps);
  }

  /** Each sequence's token mask, late ones awaited (and checked as validateStep checks the rest). */
  async #masks(plan: StepPlan): Promise<(Uint32Array | undefined)[]> {
    const masks = await Promise.all(plan.seqs.map((s) => s.lateTokenMask ?? s.tokenMask));
    masks.forEach((m, i) => {
      if (!plan.seqs[i]!.lateTokenMask) return;
      const problem = tokenMaskProblem(m!, this.config.vocabSize);
      if (problem) {
        throw new Error(`step ${plan.stepId} seq ${plan.seqs[i]!.seqId}'s late mask: ${problem}`);
      }
    });
    return masks;
  }

  /** Copies whole KV blocks, every layer's K and V, in order (StepPlan.kvCopies). */
  #copyBlocks(pairs: readonly KvCopy[]): void {
    // Every memory holds the K and V pools of its own layers: a block is copied in each.
    for (const p of this.#parts) {
      const pools = 2 * (p.end - p.start);
      const layerBytes = p.kvBytes / pools;
      const n = layerBytes / this.kv.numBlocks;
      const mem = p.heap.u8(p.kv, p.kvBytes);
      for (const [src, dst] of pairs) {
        for (let pool = 0; pool < pools; pool++) {
          const at = pool * layerBytes;
          mem.copyWithin(at + dst * n, at + src * n, at + (src + 1) * n);
        }
      }
    }
    for (const [, dst] of pairs) this.#markWritten(dst);
  }

  #embed(token: number, out: Float32Array): void {
    const t = this.#embedding;
    const n = this.#embedRowBytes;
    const data = t.data.subarray(token * n, (token + 1) * n);
    out.set(dequantize({ name: t.name, type: t.type, shape: [this.config.dim], data }));
  }

  /**
   * Runs every layer for `rows` rows, part by part: each part's memory gets the rows' inputs
   * (written into the first's) and the residual rows the part before left, then its program.
   */
  async #runLayers(rows: number, sampled: number, tableEntries: number): Promise<void> {
    const dim = this.config.dim, maxRows = this.limits.maxBatchTokens;
    const first = this.#parts[0]!;
    const inputs: [number, number][] = [
      [first.rowInts, 4 * maxRows * 4],
      [first.tables, tableEntries * 4],
      [first.rope, rows * (this.config.ropeDim / 2) * 8],
    ];
    let prev: EnginePart | undefined;
    for (const p of this.#parts) {
      if (prev) {
        const to = [p.rowInts, p.tables, p.rope];
        inputs.forEach(([from, n], i) => p.heap.u8(to[i]!, n).set(first.heap.u8(from, n)));
        p.heap.u8(p.x, rows * dim * 4).set(prev.heap.u8(prev.x, rows * dim * 4));
      }
      this.#writeLayers(p, rows, p === this.#parts[this.#parts.length - 1] ? sampled : 0);
      await this.#pool.run(p.prog, p.mem);
      prev = p;
    }
  }

  /**
   * A tensor-parallel rank's layers (one part): each layer's four segments, each followed by
   * the gather of the columns every rank computed (tp_program.ts); then the final norm of the
   * sampled rows on rank 0.
   */
  async #runShard(rows: number, sampled: number): Promise<void> {
    const tp = this.#tp!, p = this.#parts[0]!;
    const kvLayerBytes = p.kvBytes / (2 * (p.end - p.start));
    for (let i = p.start; i < p.end; i++) {
      const kc = p.kv + 2 * (i - p.start) * kvLayerBytes;
      const c: TpLayerContext = {
        config: this.config,
        part: p,
        layer: this.#layers[i]!,
        shard: tp.shard,
        hidden: tp.hidden,
        kc,
        vc: kc + kvLayerBytes,
        rows,
        maxRows: this.limits.maxBatchTokens,
        blockSize: this.kv.blockSize,
        f32kv: this.kvDtype === "f32" ? 1 : 0,
      };
      for (let seg = 0; seg < TP_GATHERS_PER_LAYER; seg++) {
        const w = new ProgramWriter(p.heap.i32(p.prog, p.progOps * OP_WORDS));
        writeTpSegment(w, seg, c);
        w.end();
        await this.#pool.run(p.prog, p.mem);
        await this.#gather(gatherTarget(seg, c), rows);
      }
    }
    if (sampled > 0) {
      const w = new ProgramWriter(p.heap.i32(p.prog, p.progOps * OP_WORDS));
      const eps = f32Bits(this.config.rmsEps), dim = this.config.dim;
      const rowmap = p.rowInts + 3 * this.limits.maxBatchTokens * 4;
      w.op(OP.normQuant, [p.x, dim, sampled, dim, this.#outputNorm, eps, rowmap, p.actOut!.desc]);
      w.end();
      await this.#pool.run(p.prog, p.mem);
    }
  }

  /** Swaps this rank's columns of `g` for every rank's and writes theirs into the full rows. */
  async #gather(g: ReturnType<typeof gatherTarget>, rows: number): Promise<void> {
    const tp = this.#tp!, heap = this.#parts[0]!.heap;
    const own = g.span(tp.shard);
    const local = g.localPtr !== undefined
      ? heap.f32(g.localPtr, rows * (own.end - own.start)).slice()
      : packColumns(heap.f32(g.ptr, rows * g.stride), g.stride, rows, own);
    const parts = await tp.exchange.exchange(local);
    if (parts.length !== tp.all.length) {
      throw new Error(
        `Invalid gather: expected the columns of ${tp.all.length} tensor-parallel ranks, received ${parts.length}`,
      );
    }
    const full = heap.f32(g.ptr, rows * g.stride);
    scatterColumns(full, g.stride, rows, parts, tp.all.map(g.span));
  }

  /** The program of one part for `rows` rows: its layers, then the final norm of the sampled rows. */
  #writeLayers(p: EnginePart, rows: number, sampled: number): void {
    const c = this.config;
    const { dim, hiddenDim, nHeads, nKvHeads, headDim } = c;
    const qDim = nHeads * headDim, kvDim = nKvHeads * headDim;
    const qkvW = qDim + 2 * kvDim;
    const maxRows = this.limits.maxBatchTokens;
    const eps = f32Bits(c.rmsEps);
    const f32kv = this.kvDtype === "f32" ? 1 : 0;
    const positions = p.rowInts, slots = p.rowInts + maxRows * 4;
    const tableOffs = p.rowInts + 2 * maxRows * 4, rowmap = p.rowInts + 3 * maxRows * 4;
    const kvLayerBytes = p.kvBytes / (2 * (p.end - p.start));
    const scoreStride = scoreBytes(c);
    const w = new ProgramWriter(p.heap.i32(p.prog, p.progOps * OP_WORDS));
    for (let i = p.start; i < p.end; i++) {
      const l = this.#layers[i]!;
      const kc = p.kv + 2 * (i - p.start) * kvLayerBytes;
      const vc = kc + kvLayerBytes;
      writeQkv(w, p, l, {
        rows,
        dim,
        nHeads,
        nKvHeads,
        headDim,
        ropeDim: c.ropeDim,
        eps,
        slots,
        kc,
        vc,
        f32kv,
      });
      w.op(OP.attention, [
        p.qkv,
        qkvW,
        0,
        p.actAtt.f,
        qDim,
        rows,
        nHeads,
        nKvHeads,
        headDim,
        positions,
        tableOffs,
        p.tables,
        this.kv.blockSize,
        kc,
        vc,
        f32Bits(1 / Math.sqrt(headDim)),
        p.scores,
        scoreStride,
        f32kv,
        ATTENTION_GROUP,
        scoreRows(c),
      ]);
      w.op(OP.quant, [p.actAtt.desc, rows, qDim]);
      w.matmul(l.wo, rows, p.actAtt.desc, p.x, dim, 0, 1);
      w.op(OP.normQuant, [p.x, dim, rows, dim, l.ffnNorm, eps, 0, p.actDim.desc]);
      w.matmul(l.wGate, rows, p.actDim.desc, p.gu, 2 * hiddenDim, 0, 0, false);
      w.matmul(l.wUp, rows, p.actDim.desc, p.gu + hiddenDim * 4, 2 * hiddenDim, 0, 0);
      w.op(OP.swiglu, [
        p.gu,
        p.gu + hiddenDim * 4,
        2 * hiddenDim,
        rows,
        hiddenDim,
        p.actHidden.desc,
      ]);
      w.matmul(l.wDown, rows, p.actHidden.desc, p.x, dim, 0, 1);
    }
    if (sampled > 0) {
      w.op(OP.normQuant, [p.x, dim, sampled, dim, this.#outputNorm, eps, rowmap, p.actOut!.desc]);
    }
    w.end();
  }
}

/** Bytes of one layer's K (or V) cache. */
function kvLayerBytesOf(config: ModelConfig, kv: KvGeometry, dtype: "f16" | "f32"): number {
  return kv.numBlocks * kv.blockSize * config.nKvHeads * config.headDim * (dtype === "f16" ? 2 : 4);
}

/**
 * Which memory holds which layers. Weights the loader already read into the process's heaps
 * stay where they are (each run of layers in one heap is a part); otherwise the layers are
 * split (layer_split.ts) over as few memories as hold them with their KV cache and step
 * buffers: heap 0 when one does, else the process's heaps 0, 1, ... or, with `memoryBytes`,
 * fresh memories of that size.
 */
function splitModel(
  config: ModelConfig,
  weights: ModelWeights,
  kv: KvGeometry,
  shape: PartShape,
  opts: WasmEngineOptions,
): { ranges: LayerRange[]; heaps: WasmHeap[] } {
  const stage = opts.layers ?? { start: 0, end: config.nLayers };
  const held = opts.memoryBytes === undefined ? heldLayers(weights, stage) : undefined;
  if (held) {
    let start = stage.start;
    const ranges = held.map((h) => ({ start, end: start += h.layers }));
    return { ranges, heaps: held.map((h) => h.heap) };
  }
  const cap = opts.memoryBytes ?? WasmHeap.MAX_BYTES;
  const kvLayer = 2 * kvLayerBytesOf(config, kv, opts.kvDtype ?? "f16");
  const tensorBytes = (t: Tensor | undefined) => (t ? byteSize(t.type, t.shape) : 0);
  const units: SplitUnit[] = weights.layers.slice(stage.start, stage.end).map((l, j) => {
    const i = stage.start + j;
    const tensors = [
      l.wq,
      l.wk,
      l.wv,
      l.wo,
      l.wGate,
      l.wUp,
      l.wDown,
      l.attnNorm,
      l.ffnNorm,
      l.qBias,
      l.kBias,
      l.vBias,
      l.qNorm,
      l.kNorm,
    ];
    const bytes = tensors.reduce((n, t) => n + tensorBytes(t), kvLayer);
    return { bytes, what: `layer ${i} (its weights and KV cache)` };
  });
  // The classifier rides with the last layer, with its buffers: the difference of a last part's.
  const n = units.length - 1;
  if (stage.end === config.nLayers) {
    const out = tensorBytes(weights.output) + tensorBytes(weights.outputNorm) +
      partOverheadBytes(shape, true) - partOverheadBytes(shape, false);
    units[n] = {
      bytes: units[n]!.bytes + out,
      what: `layer ${stage.start + n} with the classifier '${weights.output.name}' (${
        tensorBytes(weights.output)
      } bytes)`,
    };
  }
  const ranges = splitLayers(units, partOverheadBytes(shape, false), cap)
    .map((r) => ({ start: r.start + stage.start, end: r.end + stage.start }));
  const heaps = opts.memoryBytes !== undefined
    ? ranges.map(() => new WasmHeap(cap))
    : ranges.map((_, i) => wasmHeap(i));
  return { ranges, heaps };
}
