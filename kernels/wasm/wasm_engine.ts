import type {
  Engine,
  KvGeometry,
  SampledToken,
  StepPlan,
  StepResult,
} from "../../lib/engine/engine.ts";
import { validateStep } from "../../lib/engine/step_validation.ts";
import { type ModelConfig, ropeFrequencies } from "../../lib/model/model_config.ts";
import type { Tensor } from "../../lib/model/tensor.ts";
import { byteSize, TENSOR_TYPES } from "../../lib/model/tensor.ts";
import type { ModelWeights } from "../../lib/model/weights.ts";
import { dequantize } from "../../lib/model/dequantize.ts";
import { DEFAULT_LIMITS } from "../../lib/engine/limits.ts";
import { type WasmHeap, wasmHeap } from "./heap.ts";
import { ActBuffer } from "./act_buffer.ts";
import { ThreadPool } from "./pool.ts";
import { ATTENTION_GROUP, f32Bits, OP, OP_WORDS, ProgramWriter } from "./program.ts";
import { type KernelFlavour, kernelModule } from "./kernel_module.ts";
import { sampleRow, samplesArgmax } from "../../lib/engine/sample_row.ts";
import { sampleMaskedRow } from "./masked_sampling.ts";
import { tokenMaskProblem } from "../../lib/engine/token_mask.ts";
import { checkParams } from "../../lib/engine/sampling.ts";
import { applyLogitAdjust } from "../../lib/engine/logit_adjust.ts";
import { topLogprobs } from "../../lib/engine/top_logprobs.ts";

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
}

/** Classifier rows computed per program: bounds the logits buffer (rows × vocabulary). */
const LOGIT_ROWS = 16;

/** A matrix as the kernels read it: its type code, address and shape. */
interface Matrix {
  readonly type: number;
  readonly ptr: number;
  readonly rows: number;
  readonly cols: number;
}

interface LayerPtrs {
  readonly attnNorm: number;
  readonly ffnNorm: number;
  readonly wq: Matrix;
  readonly wk: Matrix;
  readonly wv: Matrix;
  readonly wo: Matrix;
  readonly wGate: Matrix;
  readonly wUp: Matrix;
  readonly wDown: Matrix;
  readonly qBias: number;
  readonly kBias: number;
  readonly vBias: number;
  readonly qNorm: number;
  readonly kNorm: number;
}

/** Weights already placed in the heap, per tensor: shared by every engine over the model. */
const placed = new WeakMap<Tensor, number>();

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
export class WasmEngine implements Engine {
  readonly name = "cpu";
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

  readonly #heap: WasmHeap;
  // Notes a KV block a step writes: the cache's pages become resident only then.
  readonly #markWritten: (block: number) => void;
  readonly #pool: ThreadPool;
  readonly #layers: LayerPtrs[];
  readonly #output: Matrix;
  readonly #outputNorm: number;
  readonly #embedding: Tensor;
  readonly #embedRowBytes: number;
  readonly #freqs: Float64Array;
  readonly #owned: [number, number][] = [];
  readonly #lastSampled = new Map<number, number>();
  #queue: Promise<unknown> = Promise.resolve();
  #disposed = false;

  // Step buffers.
  readonly #x: number;
  readonly #qkv: number;
  readonly #gu: number;
  readonly #actDim: ActBuffer;
  readonly #actAtt: ActBuffer;
  readonly #actHidden: ActBuffer;
  readonly #actOut: ActBuffer;
  readonly #logits: number;
  readonly #stats: number;
  readonly #rowInts: number; // positions | slots | tableOffs | rowmap, maxRows each
  readonly #tables: number;
  readonly #tableCap: number;
  readonly #rope: number;
  readonly #scores: number;
  readonly #scoreBytes: number;
  readonly #scoreRows: number;
  readonly #prog: number;
  readonly #progOps: number;
  readonly #chunkDesc: number;
  readonly #kv: number;
  readonly #kvLayerBytes: number;

  private constructor(
    readonly config: ModelConfig,
    weights: ModelWeights,
    kv: KvGeometry,
    pool: ThreadPool,
    heap: WasmHeap,
    opts: WasmEngineOptions & { flavour: KernelFlavour },
  ) {
    const { dim, hiddenDim, nHeads, nKvHeads, headDim, vocabSize, nLayers } = config;
    this.kv = { numBlocks: kv.numBlocks, blockSize: kv.blockSize };
    this.#heap = heap;
    this.#pool = pool;
    this.threads = pool.threads;
    this.flavour = opts.flavour;
    this.kvDtype = opts.kvDtype ?? "f16";
    const maxRows = opts.maxBatchTokens ?? DEFAULT_LIMITS.maxBatchTokens;
    const maxSeqs = opts.maxSeqs ?? DEFAULT_LIMITS.maxRunning;
    this.limits = { maxSeqs, maxBatchTokens: maxRows };
    this.#freqs = ropeFrequencies(config);
    this.#embedding = weights.tokenEmbedding;
    this.#embedRowBytes = byteSize(weights.tokenEmbedding.type, [config.dim]);

    const qDim = nHeads * headDim, kvDim = nKvHeads * headDim;
    let weightBytes = 0;
    const vector = (t: Tensor | undefined, n: number): number => {
      if (!t) return 0;
      weightBytes += n * 4;
      const hit = placed.get(t);
      if (hit !== undefined) return hit;
      const values = dequantize(t);
      if (values.length !== n) {
        throw new Error(`Cannot build the CPU engine: '${t.name}' has ${values.length} values, expected ${n}`);
      }
      const p = heap.alloc(n * 4, `'${t.name}'`);
      heap.f32(p, n).set(values);
      placed.set(t, p);
      return p;
    };
    const matrix = (t: Tensor, rows: number, cols: number): Matrix => {
      if (t.shape.length !== 2 || t.shape[0] !== rows || t.shape[1] !== cols) {
        throw new Error(
          `Cannot build the CPU engine: '${t.name}' has shape [${t.shape.join(", ")}], expected [${rows}, ${cols}]`,
        );
      }
      const type = TENSOR_TYPES.indexOf(t.type);
      const bytes = byteSize(t.type, t.shape);
      weightBytes += bytes;
      let ptr = placed.get(t);
      if (ptr === undefined) {
        if (heap.owns(t.data)) {
          ptr = t.data.byteOffset;
        } else {
          // Tensors made at load (neox Q/K rows reordered) or read into ordinary memory.
          ptr = heap.alloc(bytes, `'${t.name}'`);
          heap.u8(ptr, bytes).set(t.data.subarray(0, bytes));
        }
        placed.set(t, ptr);
      }
      return { type, ptr, rows, cols };
    };
    this.#layers = weights.layers.map((l) => ({
      attnNorm: vector(l.attnNorm, dim),
      ffnNorm: vector(l.ffnNorm, dim),
      wq: matrix(l.wq, qDim, dim),
      wk: matrix(l.wk, kvDim, dim),
      wv: matrix(l.wv, kvDim, dim),
      wo: matrix(l.wo, dim, qDim),
      wGate: matrix(l.wGate, hiddenDim, dim),
      wUp: matrix(l.wUp, hiddenDim, dim),
      wDown: matrix(l.wDown, dim, hiddenDim),
      qBias: vector(l.qBias, qDim),
      kBias: vector(l.kBias, kvDim),
      vBias: vector(l.vBias, kvDim),
      qNorm: vector(l.qNorm, headDim),
      kNorm: vector(l.kNorm, headDim),
    }));
    if (this.#layers.length !== nLayers) {
      throw new Error(`Cannot build the CPU engine: config says ${nLayers} layers, weights hold ${this.#layers.length}`);
    }
    this.#output = matrix(weights.output, vocabSize, dim);
    // The embedding is read in place row by row; a tied one is the classifier, counted above.
    if (weights.output !== weights.tokenEmbedding) {
      weightBytes += byteSize(weights.tokenEmbedding.type, weights.tokenEmbedding.shape);
    }
    this.#outputNorm = vector(weights.outputNorm, dim);

    const own = (bytes: number, what: string) => {
      const p = heap.alloc(bytes, what);
      this.#owned.push([p, bytes]);
      return p;
    };
    const elt = this.kvDtype === "f16" ? 2 : 4;
    this.#kvLayerBytes = kv.numBlocks * kv.blockSize * kvDim * elt;
    const kvBytes = 2 * nLayers * this.#kvLayerBytes;
    this.#kv = own(kvBytes, `the KV cache (${kv.numBlocks} blocks)`);
    const before = this.#owned.length;
    this.#x = own(maxRows * dim * 4, "the residual rows");
    this.#qkv = own(maxRows * (qDim + 2 * kvDim) * 4, "the q/k/v rows");
    this.#gu = own(maxRows * 2 * hiddenDim * 4, "the gate/up rows");
    this.#actDim = new ActBuffer(heap, maxRows, dim, "activation rows");
    this.#actAtt = new ActBuffer(heap, maxRows, qDim, "attention rows");
    this.#actHidden = new ActBuffer(heap, maxRows, hiddenDim, "hidden rows");
    this.#actOut = new ActBuffer(heap, maxSeqs, dim, "classifier rows");
    this.#logits = own(LOGIT_ROWS * vocabSize * 4, "the logits");
    this.#stats = own(LOGIT_ROWS * 16, "the logits' row statistics");
    this.#rowInts = own(4 * maxRows * 4, "per-row indices");
    this.#tableCap = maxSeqs * Math.min(kv.numBlocks, Math.ceil(config.contextLength / kv.blockSize));
    this.#tables = own(this.#tableCap * 4, "block tables");
    this.#rope = own(maxRows * (config.ropeDim / 2) * 8, "RoPE tables");
    // Each thread's scores: a row of them for every query the attention op computes together.
    this.#scoreRows = Math.max(ATTENTION_GROUP, nHeads / nKvHeads);
    this.#scoreBytes = this.#scoreRows * Math.ceil((config.contextLength + 16) * 4 / 64) * 64;
    this.#scores = own(this.#scoreBytes * pool.threads, "attention scores");
    this.#progOps = nLayers * 16 + 8;
    this.#prog = own(this.#progOps * OP_WORDS * 4, "the step program");
    this.#chunkDesc = own(64, "a classifier descriptor");
    const buffers = this.#owned.slice(before).reduce((n, [, b]) => n + b, 0) +
      [this.#actDim, this.#actAtt, this.#actHidden, this.#actOut].reduce((n, a) => n + a.bytes, 0);
    const blockBytes = kvBytes / kv.numBlocks;
    const written = new Uint8Array(kv.numBlocks);
    let blocks = 0;
    this.#markWritten = (b) => {
      if (written[b] === 0) (written[b] = 1, blocks++);
    };
    this.memory = {
      weights: weightBytes,
      kvCache: kvBytes,
      buffers,
      get kvResident() {
        return blocks * blockBytes;
      },
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
      throw new Error(`Cannot create the CPU engine: head size ${config.headDim} must be a multiple of 8`);
    }
    const heap = wasmHeap();
    const { module, flavour } = kernelModule(opts.flavour);
    const threads = opts.threads ?? navigator.hardwareConcurrency;
    const pool = await ThreadPool.start(heap, module, threads);
    try {
      return new WasmEngine(config, weights, kv, pool, heap, { ...opts, flavour });
    } catch (e) {
      pool.close();
      throw e;
    }
  }

  step(plan: StepPlan): Promise<StepResult> {
    const result = this.#queue.then(() => this.#runStep(plan));
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
      for (const [p, n] of this.#owned) this.#heap.free(p, n);
      for (const a of [this.#actDim, this.#actAtt, this.#actHidden, this.#actOut]) a.free();
    });
    this.#lastSampled.clear();
  }

  async #runStep(plan: StepPlan): Promise<StepResult> {
    if (this.#disposed) throw new Error(`Cannot run step ${plan.stepId}: the CPU engine was disposed`);
    const { config } = this;
    const { dim, vocabSize } = config;
    const bs = this.kv.blockSize;
    validateStep(plan, {
      config,
      kv: this.kv,
      hasLastSampled: (id) => this.#lastSampled.has(id),
      capacity: {
        maxRows: this.limits.maxBatchTokens,
        maxSeqs: this.limits.maxSeqs,
        maxTableEntries: this.#tableCap,
      },
    });
    const heap = this.#heap;
    const maxRows = this.limits.maxBatchTokens;
    const ints = heap.i32(this.#rowInts, 4 * maxRows);
    const positions = ints.subarray(0, maxRows);
    const slots = ints.subarray(maxRows, 2 * maxRows);
    const tableOffs = ints.subarray(2 * maxRows, 3 * maxRows);
    const rowmap = ints.subarray(3 * maxRows, 4 * maxRows);
    const tables = heap.i32(this.#tables, this.#tableCap);
    const x = heap.f32(this.#x, maxRows * dim);
    const pairs = config.ropeDim / 2;
    const rope = heap.f32(this.#rope, maxRows * pairs * 2);

    let rows = 0, tableAt = 0;
    const sampling: { seq: number; row: number }[] = [];
    plan.seqs.forEach((seq, i) => {
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
        this.#embed(token, x.subarray(rows * dim, (rows + 1) * dim));
        for (let p = 0; p < pairs; p++) {
          const angle = pos * this.#freqs[p]!;
          rope[(rows * pairs + p) * 2] = Math.cos(angle);
          rope[(rows * pairs + p) * 2 + 1] = Math.sin(angle);
        }
        rows++;
      });
      tableAt += needed;
      if (seq.sample) {
        rowmap[sampling.length] = rows - 1;
        sampling.push({ seq: i, row: rows - 1 });
      }
    });

    this.#writeLayers(rows, sampling.length);
    await this.#pool.run(this.#prog);

    const sampled: SampledToken[] = [];
    let masks: (Uint32Array | undefined)[] | undefined;
    for (let c = 0; c < sampling.length; c += LOGIT_ROWS) {
      const n = Math.min(LOGIT_ROWS, sampling.length - c);
      this.#actOut.writeOffsetDesc(this.#chunkDesc, c);
      const w = new ProgramWriter(heap.i32(this.#prog, this.#progOps * OP_WORDS));
      const o = this.#output;
      w.op(OP.matmul, [o.type, o.ptr, o.rows, o.cols, this.#chunkDesc, n, this.#logits, vocabSize, 0, 0]);
      w.op(OP.rowStats, [this.#logits, n, vocabSize, this.#stats]);
      w.end();
      await this.#pool.run(this.#prog);
      // Late masks were computed while the layers and the first logits ran.
      masks ??= await this.#masks(plan);
      const logits = heap.f32(this.#logits, n * vocabSize);
      const stats = heap.i32(this.#stats, n * 4), statsF = heap.f32(this.#stats, n * 4);
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
          ? (checkParams(seq.sampling, vocabSize), { token: stats[r * 4]!, logprob: -Math.log(statsF[r * 4 + 2]!) })
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
    return { stepId: plan.stepId, sampled };
  }

  /** Each sequence's token mask, late ones awaited (and checked as validateStep checks the rest). */
  async #masks(plan: StepPlan): Promise<(Uint32Array | undefined)[]> {
    const masks = await Promise.all(plan.seqs.map((s) => s.lateTokenMask ?? s.tokenMask));
    masks.forEach((m, i) => {
      if (!plan.seqs[i]!.lateTokenMask) return;
      const problem = tokenMaskProblem(m!, this.config.vocabSize);
      if (problem) throw new Error(`step ${plan.stepId} seq ${plan.seqs[i]!.seqId}'s late mask: ${problem}`);
    });
    return masks;
  }

  #embed(token: number, out: Float32Array): void {
    const t = this.#embedding;
    const n = this.#embedRowBytes;
    const data = t.data.subarray(token * n, (token + 1) * n);
    out.set(dequantize({ name: t.name, type: t.type, shape: [this.config.dim], data }));
  }

  /** The program of one step: every layer for `rows` rows, then the final norm of the sampled rows. */
  #writeLayers(rows: number, sampled: number): void {
    const c = this.config;
    const { dim, hiddenDim, nHeads, nKvHeads, headDim } = c;
    const qDim = nHeads * headDim, kvDim = nKvHeads * headDim;
    const qkvW = qDim + 2 * kvDim;
    const maxRows = this.limits.maxBatchTokens;
    const eps = f32Bits(c.rmsEps);
    const f32kv = this.kvDtype === "f32" ? 1 : 0;
    const positions = this.#rowInts, slots = this.#rowInts + maxRows * 4;
    const tableOffs = this.#rowInts + 2 * maxRows * 4, rowmap = this.#rowInts + 3 * maxRows * 4;
    const w = new ProgramWriter(this.#heap.i32(this.#prog, this.#progOps * OP_WORDS));
    const mm = (m: Matrix, desc: number, out: number, ostride: number, bias: number, accum: number, barrier = true) =>
      w.op(OP.matmul, [m.type, m.ptr, m.rows, m.cols, desc, rows, out, ostride, bias, accum], barrier);
    this.#layers.forEach((l, i) => {
      const kc = this.#kv + 2 * i * this.#kvLayerBytes;
      const vc = kc + this.#kvLayerBytes;
      w.op(OP.normQuant, [this.#x, dim, rows, dim, l.attnNorm, eps, 0, this.#actDim.desc]);
      mm(l.wq, this.#actDim.desc, this.#qkv, qkvW, l.qBias, 0, false);
      mm(l.wk, this.#actDim.desc, this.#qkv + qDim * 4, qkvW, l.kBias, 0, false);
      mm(l.wv, this.#actDim.desc, this.#qkv + (qDim + kvDim) * 4, qkvW, l.vBias, 0);
      w.op(OP.qkvPost, [
        this.#qkv, qkvW, 0, qDim, qDim + kvDim, rows, nHeads, nKvHeads, headDim, c.ropeDim,
        this.#rope, l.qNorm, l.kNorm, eps, slots, kc, vc, f32kv,
      ]);
      w.op(OP.attention, [
        this.#qkv, qkvW, 0, this.#actAtt.f, qDim, rows, nHeads, nKvHeads, headDim, positions,
        tableOffs, this.#tables, this.kv.blockSize, kc, vc, f32Bits(1 / Math.sqrt(headDim)),
        this.#scores, this.#scoreBytes, f32kv, ATTENTION_GROUP, this.#scoreRows,
      ]);
      w.op(OP.quant, [this.#actAtt.desc, rows, qDim]);
      mm(l.wo, this.#actAtt.desc, this.#x, dim, 0, 1);
      w.op(OP.normQuant, [this.#x, dim, rows, dim, l.ffnNorm, eps, 0, this.#actDim.desc]);
      mm(l.wGate, this.#actDim.desc, this.#gu, 2 * hiddenDim, 0, 0, false);
      mm(l.wUp, this.#actDim.desc, this.#gu + hiddenDim * 4, 2 * hiddenDim, 0, 0);
      w.op(OP.swiglu, [this.#gu, this.#gu + hiddenDim * 4, 2 * hiddenDim, rows, hiddenDim, this.#actHidden.desc]);
      mm(l.wDown, this.#actHidden.desc, this.#x, dim, 0, 1);
    });
    if (sampled > 0) {
      w.op(OP.normQuant, [this.#x, dim, sampled, dim, this.#outputNorm, eps, rowmap, this.#actOut.desc]);
    }
    w.end();
  }
}
