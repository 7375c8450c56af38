import type {
  Engine,
  KvGeometry,
  SampledToken,
  StepPlan,
  StepResult,
} from "../lib/engine/engine.ts";
import { dequantize } from "../lib/model/dequantize.ts";
import { NO_EXTRA_STEPS } from "../lib/model/architecture.ts";
import type { ModelConfig } from "../lib/model/model_config.ts";
import type { Tensor } from "../lib/model/tensor.ts";
import type { ModelWeights } from "../lib/model/weights.ts";
import { createAttention } from "./attention.ts";
import { acquireGpu, type Gpu, type KernelOp } from "./device.ts";
import { createEmbedding } from "./embedding.ts";
import {
  concatRows,
  destroyMatrix,
  type GpuMatrix,
  interleaveRows,
  type RowSource,
  stackable,
  uploadMatrix,
  uploadVector,
} from "./gpu_matrix.ts";
import { createMatmul } from "./matmul.ts";
import { createQkPrep } from "./qk_prep.ts";
import { createRopeStore, uploadRopeTable } from "./rope.ts";
import { createSampler } from "./sample.ts";
import { TokenMaskUpload } from "./token_masks.ts";
import { DIM_ROWS, DIM_SAMPLES, StepMetaLayout } from "./step_meta.ts";
import { createSwiglu } from "./swiglu.ts";
import { planStep } from "./step_plan.ts";
import { DEFAULT_LIMITS } from "../lib/engine/limits.ts";
import { kvBlockBytes, kvBlocksIn } from "../lib/engine/kv_budget.ts";

/** How much KV cache to allocate: a block count, or a byte budget it is derived from. */
export interface KvBudget {
  readonly numBlocks?: number;
  readonly kvBytes?: number;
  /** Tokens per block (default DEFAULT_LIMITS.blockSize). */
  readonly blockSize?: number;
}

export interface WebGpuEngineOptions {
  /** A device to share; by default the engine acquires (and on dispose destroys) its own. */
  readonly gpu?: Gpu;
  /** Token rows one step may hold (prefill chunk tokens + decodes); default DEFAULT_LIMITS. */
  readonly maxBatchTokens?: number;
  /** Sequences one step may hold; default DEFAULT_LIMITS.maxRunning. */
  readonly maxSeqs?: number;
  /** Plans one stepMany() call may encode into one submit; default DEFAULT_LIMITS. */
  readonly maxStepsPerSubmit?: number;
  /** Bytes of weights uploaded so far and in all, after each matrix (a start-up progress bar). */
  readonly onUpload?: (bytes: number, total: number) => void;
}

/**
 * The Llama forward pass as WGSL kernels over a ragged batch with a paged KV cache. Weights stay
 * in their file encoding on the device; every buffer is allocated here, once; a step is one
 * command buffer and one submit, and only the sampled ids and logprobs are read back. A
 * sequence's sampled token stays on the device as its next input (`useLastSampled`), so step
 * t+1 can be submitted before step t's readback arrives.
 *
 * ```ts
 * const engine = await WebGpuEngine.create(model.config, model.weights, { kvBytes: 64 << 20 });
 * const first = engine.step(prefillPlan);   // not awaited:
 * const second = engine.step(decodePlan);   // submitted at once, decoding first's token on the GPU
 * ```
 */
export class WebGpuEngine implements Engine {
  readonly name = "webgpu";

  get limits(): { maxSeqs: number; maxBatchTokens: number } {
    return { maxSeqs: this.layout.capacity.maxSeqs, maxBatchTokens: this.layout.capacity.maxRows };
  }
  readonly kv: KvGeometry;
  /** Bytes of device memory held, by purpose, for the start-up line. */
  readonly memory: {
    readonly weights: number;
    readonly kvCache: number;
    readonly activations: number;
  };

  private readonly layout: StepMetaLayout;
  private readonly staging: GPUBuffer;
  private readonly stagingCpu: Uint8Array<ArrayBuffer>;
  private readonly meta: GPUBuffer;
  private readonly out: GPUBuffer;
  private readonly logits: GPUBuffer;
  private readonly rowOps: KernelOp[];
  private readonly sampleOps: KernelOp[];
  private readonly masks: TokenMaskUpload;
  private readonly readbacks: GPUBuffer[] = [];
  private readonly owned: { destroy(): void }[];
  /** seqId -> slot of the device table holding the token it sampled last; Map order is LRU. */
  private readonly lastSlots = new Map<number, number>();
  private readonly freeSlots: number[];
  private lost: string | undefined;

  private constructor(
    readonly config: ModelConfig,
    readonly gpu: Gpu,
    private readonly ownsDevice: boolean,
    parts: {
      kv: KvGeometry;
      layout: StepMetaLayout;
      maxStepsPerSubmit: number;
      meta: GPUBuffer;
      out: GPUBuffer;
      logits: GPUBuffer;
      rowOps: KernelOp[];
      sampleOps: KernelOp[];
      masks: TokenMaskUpload;
      owned: { destroy(): void }[];
      slotCapacity: number;
      memory: WebGpuEngine["memory"];
    },
  ) {
    this.kv = parts.kv;
    this.layout = parts.layout;
    this.meta = parts.meta;
    this.out = parts.out;
    this.logits = parts.logits;
    this.rowOps = parts.rowOps;
    this.sampleOps = parts.sampleOps;
    this.masks = parts.masks;
    this.owned = parts.owned;
    this.memory = parts.memory;
    this.stagingCpu = new Uint8Array(parts.layout.bytes * parts.maxStepsPerSubmit);
    this.staging = gpu.device.createBuffer({
      size: this.stagingCpu.byteLength,
      usage: GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC,
      label: "step meta staging",
    });
    this.owned.push(this.staging);
    this.freeSlots = Array.from(
      { length: parts.slotCapacity },
      (_, i) => parts.slotCapacity - 1 - i,
    );
    gpu.device.lost.then((info) => {
      this.lost = `the WebGPU device was lost (${info.reason}: ${info.message})`;
    });
  }

  /**
   * Uploads the weights, allocates the KV pools and every activation buffer, and compiles the
   * pipelines. Throws on unsupported tensor types or shapes, and when a buffer exceeds the
   * device's binding limit.
   */
  static async create(
    config: ModelConfig,
    weights: ModelWeights,
    budget: KvBudget,
    opts: WebGpuEngineOptions = {},
  ): Promise<WebGpuEngine> {
    const gpu = opts.gpu ?? await acquireGpu();
    const { device } = gpu;
    const { dim, hiddenDim, nLayers, nHeads, nKvHeads, headDim, vocabSize, rmsEps } = config;
    const qDim = nHeads * headDim;
    const kvDim = nKvHeads * headDim;
    const blockSize = budget.blockSize ?? DEFAULT_LIMITS.blockSize;
    /** One layer's K (or V) share of a block. */
    const blockBytes = blockSize * kvDim * 4;
    const allLayersBlockBytes = kvBlockBytes(config, blockSize);
    const numBlocks = budget.numBlocks ?? kvBlocksIn(budget.kvBytes ?? 0, config, blockSize);
    const fail = (why: string): never => {
      throw new Error(`Cannot create WebGPU engine: ${why}`);
    };
    if (
      !(Number.isInteger(numBlocks) && numBlocks > 0 && Number.isInteger(blockSize) &&
        blockSize > 0)
    ) {
      fail(
        `the KV budget gives ${numBlocks} blocks of ${blockSize} tokens; pass numBlocks or kvBytes (at least ${allLayersBlockBytes} bytes, one block)`,
      );
    }
    if (numBlocks * blockBytes > gpu.maxBindingBytes) {
      fail(
        `one layer's K pool of ${numBlocks} blocks needs ${
          numBlocks * blockBytes
        } bytes, above the device's binding limit of ${gpu.maxBindingBytes}; lower the KV budget to at most ${
          Math.floor(gpu.maxBindingBytes / blockBytes) * allLayersBlockBytes
        } bytes`,
      );
    }
    if (nHeads % nKvHeads !== 0 || headDim % 2 !== 0 || config.ropeDim > headDim) {
      fail(
        `unsupported head layout: ${nHeads} query heads, ${nKvHeads} KV heads, head size ${headDim}, RoPE dims ${config.ropeDim}`,
      );
    }
    if (weights.layers.length !== nLayers) {
      fail(`the config says ${nLayers} layers, the weights hold ${weights.layers.length}`);
    }
    const maxRows = opts.maxBatchTokens ?? DEFAULT_LIMITS.maxBatchTokens;
    const maxSeqs = opts.maxSeqs ?? DEFAULT_LIMITS.maxRunning;
    const maxStepsPerSubmit = opts.maxStepsPerSubmit ?? DEFAULT_LIMITS.maxStepsPerSubmit;
    const blocksPerSeq = Math.min(numBlocks, Math.ceil(config.contextLength / blockSize));
    const layout = new StepMetaLayout({
      maxRows,
      maxSeqs,
      maxTableEntries: maxSeqs * blocksPerSeq,
    });

    device.pushErrorScope("out-of-memory");
    device.pushErrorScope("validation");
    const owned: { destroy(): void }[] = [];
    const matrices = new Map<Tensor | RowSource, GpuMatrix>();
    const check = (t: Tensor, shape: readonly number[]) => {
      if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
        fail(
          `tensor '${t.name}' has shape [${t.shape.join(", ")}], expected [${shape.join(", ")}]`,
        );
      }
      return t;
    };
    const allWeights = new Set<Tensor>([weights.tokenEmbedding, weights.output]);
    for (const w of weights.layers) {
      for (const t of [w.wq, w.wk, w.wv, w.wo, w.wGate, w.wUp, w.wDown]) allWeights.add(t);
    }
    const uploadTotal = [...allWeights].reduce((n, t) => n + t.data.byteLength, 0);
    let uploaded = 0;
    const upload = (t: Tensor | RowSource): GpuMatrix => {
      let mm = matrices.get(t);
      if (!mm) {
        const created = uploadMatrix(gpu, t);
        uploaded = Math.min(
          uploadTotal,
          uploaded + ("copyRows" in t ? t.byteLength : t.data.byteLength),
        );
        opts.onUpload?.(uploaded, uploadTotal);
        matrices.set(t, created);
        owned.push({ destroy: () => destroyMatrix(created) });
        mm = created;
      }
      return mm;
    };
    const vector = (t: Tensor, length = dim): GPUBuffer => {
      const b = uploadVector(gpu, dequantize(check(t, [length])), t.name);
      owned.push(b);
      return b;
    };
    const steps = config.steps ?? NO_EXTRA_STEPS;
    const present = (t: Tensor | undefined, what: string, l: number): Tensor =>
      t ?? fail(`the ${what} step is on but layer ${l} has no ${what} tensors`);
    const buffer = (
      bytes: number,
      label: string,
      usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC,
    ): GPUBuffer => {
      if (bytes > gpu.maxBindingBytes) {
        fail(
          `buffer '${label}' needs ${bytes} bytes, above the device's binding limit of ${gpu.maxBindingBytes}; lower maxBatchTokens or maxSeqs`,
        );
      }
      const b = device.createBuffer({ size: Math.max(16, Math.ceil(bytes / 4) * 4), usage, label });
      owned.push(b);
      return b;
    };

    const meta = buffer(
      layout.bytes,
      "step meta",
      GPUBufferUsage.UNIFORM | GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
    );
    const m = layout.bindings(meta);
    const slotCapacity = Math.max(1024, 4 * maxSeqs);
    const qkvStride = qDim + 2 * kvDim;
    const act = {
      x: buffer(maxRows * dim * 4, "x"),
      qkv: buffer(maxRows * qkvStride * 4, "qkv"),
      att: buffer(maxRows * qDim * 4, "att"),
      hidden: buffer(maxRows * hiddenDim * 4, "hidden"),
      logits: buffer(maxSeqs * vocabSize * 4, "logits"),
      out: buffer(maxSeqs * 8, "sampled"),
      lastSampled: buffer(slotCapacity * 4, "last sampled"),
    };
    const ropeTable = uploadRopeTable(gpu, config, config.contextLength);
    owned.push(ropeTable);
    const rows = { dims: m.dims, rowsField: DIM_ROWS };
    let up: GPUBuffer | undefined; // only when gate and up cannot share one matmul

    const embedding = upload(check(weights.tokenEmbedding, [vocabSize, dim]));
    const rowOps: KernelOp[] = [
      createEmbedding(gpu, embedding, {
        dims: m.dims,
        rows: m.rows,
        lastSampled: act.lastSampled,
        x: act.x,
      }),
    ];
    let kvBytes = 0;
    weights.layers.forEach((w, l) => {
      const kCache = buffer(numBlocks * blockBytes, `K pool ${l}`);
      const vCache = buffer(numBlocks * blockBytes, `V pool ${l}`);
      kvBytes += kCache.size + vCache.size;
      // q, k and v: one matmul over the stacked rows when the encodings allow, with the norm fused.
      const attnNorm = { weight: vector(w.attnNorm), eps: rmsEps };
      const qkv = [check(w.wq, [qDim, dim]), check(w.wk, [kvDim, dim]), check(w.wv, [kvDim, dim])];
      // Biases and q/k norms run between the projection and RoPE, so they rule out the fusion.
      const extraSteps = steps.qkvBias || steps.qkNorm;
      const fuseRope = stackable(qkv) && gpu.cpuRasterizer && !extraSteps;
      if (fuseRope) {
        // The lane matmul rotates q and k and stores k and v itself: one dispatch fewer.
        rowOps.push(
          createMatmul(gpu, upload(concatRows(qkv, `blk.${l}.qkv`)), {
            ...rows,
            x: act.x,
            y: act.qkv,
            yStride: qkvStride,
            norm: attnNorm,
            epilogue: "rope",
            rope: {
              shape: { qDim, kvDim, headDim, ropeDim: config.ropeDim },
              rows: m.rows,
              table: ropeTable,
              kCache,
              vCache,
            },
            layout: "lane",
            label: "qkv+rope+kv store",
          }),
        );
      } else if (stackable(qkv)) {
        rowOps.push(
          createMatmul(gpu, upload(concatRows(qkv, `blk.${l}.qkv`)), {
            ...rows,
            x: act.x,
            y: act.qkv,
            norm: attnNorm,
            label: "qkv",
          }),
        );
      } else {
        [0, qDim, qDim + kvDim].forEach((yOffset, i) => {
          rowOps.push(
            createMatmul(gpu, upload(qkv[i]!), {
              ...rows,
              x: act.x,
              y: act.qkv,
              yStride: qkvStride,
              yOffset,
              norm: attnNorm,
              label: "q|k|v",
            }),
          );
        });
      }
      if (extraSteps) {
        let bias: GPUBuffer | undefined;
        if (steps.qkvBias) {
          const parts = [
            dequantize(check(present(w.qBias, "qkvBias", l), [qDim])),
            dequantize(check(present(w.kBias, "qkvBias", l), [kvDim])),
            dequantize(check(present(w.vBias, "qkvBias", l), [kvDim])),
          ];
          const all = new Float32Array(qkvStride);
          all.set(parts[0]!, 0);
          all.set(parts[1]!, qDim);
          all.set(parts[2]!, qDim + kvDim);
          bias = uploadVector(gpu, all, `blk.${l}.qkv_bias`);
          owned.push(bias);
        }
        rowOps.push(createQkPrep(gpu, config, steps, {
          dims: m.dims,
          qkv: act.qkv,
          ...(bias ? { bias } : {}),
          ...(steps.qkNorm
            ? {
              qNorm: vector(present(w.qNorm, "qkNorm", l), headDim),
              kNorm: vector(present(w.kNorm, "qkNorm", l), headDim),
            }
            : {}),
        }));
      }
      if (!fuseRope) {
        rowOps.push(
          createRopeStore(gpu, config, {
            dims: m.dims,
            rows: m.rows,
            table: ropeTable,
            qkv: act.qkv,
            kCache,
            vCache,
          }),
        );
      }
      rowOps.push(
        createAttention(gpu, config, blockSize, {
          dims: m.dims,
          rows: m.rows,
          seqs: m.seqs,
          tables: m.tables,
          qkv: act.qkv,
          kCache,
          vCache,
          out: act.att,
        }),
        createMatmul(gpu, upload(check(w.wo, [dim, qDim])), {
          ...rows,
          x: act.att,
          y: act.x,
          epilogue: "accumulate",
          label: "wo",
        }),
      );
      const ffnNorm = { weight: vector(w.ffnNorm), eps: rmsEps };
      const gate = check(w.wGate, [hiddenDim, dim]);
      const upT = check(w.wUp, [hiddenDim, dim]);
      if (stackable([gate, upT])) {
        const gateUp = upload(interleaveRows(gate, upT, `blk.${l}.gate_up`));
        rowOps.push(
          createMatmul(gpu, gateUp, {
            ...rows,
            x: act.x,
            y: act.hidden,
            norm: ffnNorm,
            epilogue: "swiglu",
            label: "gate_up",
          }),
        );
      } else {
        up ??= buffer(maxRows * hiddenDim * 4, "up");
        rowOps.push(
          createMatmul(gpu, upload(gate), {
            ...rows,
            x: act.x,
            y: act.hidden,
            norm: ffnNorm,
            label: "gate",
          }),
          createMatmul(gpu, upload(upT), { ...rows, x: act.x, y: up, norm: ffnNorm, label: "up" }),
          createSwiglu(gpu, hiddenDim, { dims: m.dims, gate: act.hidden, up }),
        );
      }
      rowOps.push(
        createMatmul(gpu, upload(check(w.wDown, [dim, hiddenDim])), {
          ...rows,
          x: act.hidden,
          y: act.x,
          epilogue: "accumulate",
          label: "down",
        }),
      );
    });
    const masks = new TokenMaskUpload(gpu, vocabSize, maxSeqs, maxStepsPerSubmit);
    owned.push(masks);
    const activationBytes = Object.values(act).reduce((s, b) => s + b.size, 0) + meta.size +
      (up?.size ?? 0) + masks.buffer.size;
    const sampleOps: KernelOp[] = [
      createMatmul(gpu, upload(check(weights.output, [vocabSize, dim])), {
        dims: m.dims,
        rowsField: DIM_SAMPLES,
        x: act.x,
        y: act.logits,
        norm: { weight: vector(weights.outputNorm), eps: rmsEps },
        samples: m.samples,
        label: "logits",
      }),
      createSampler(gpu, vocabSize, {
        dims: m.dims,
        samples: m.samples,
        logits: act.logits,
        out: act.out,
        lastSampled: act.lastSampled,
        masks,
      }),
    ];
    const weightBytes = [...matrices.values()].reduce(
      (s, mm) => s + mm.chunks.reduce((a, c) => a + c.buffer.size, 0),
      0,
    );
    const validation = await device.popErrorScope();
    const oom = await device.popErrorScope();
    if (validation || oom) {
      for (const o of owned) o.destroy();
      fail(`the device rejected the set-up: ${(validation ?? oom)!.message}`);
    }
    return new WebGpuEngine(config, gpu, opts.gpu === undefined, {
      kv: { numBlocks, blockSize },
      layout,
      maxStepsPerSubmit,
      meta,
      out: act.out,
      logits: act.logits,
      rowOps,
      sampleOps,
      masks,
      owned,
      slotCapacity,
      memory: { weights: weightBytes, kvCache: kvBytes, activations: activationBytes },
    });
  }

  step(plan: StepPlan): Promise<StepResult> {
    return this.stepMany([plan])[0]!;
  }

  /**
   * Encodes several plans into one command buffer and one submit (k decode steps at once).
   * A later plan may use `useLastSampled` for a sequence an earlier one samples.
   */
  stepMany(plans: readonly StepPlan[]): Promise<StepResult>[] {
    try {
      return this.submit(plans);
    } catch (e) {
      // A bad plan changes nothing on the device; every step of the call reports it.
      return plans.map(() => Promise.reject(e));
    }
  }

  private submit(plans: readonly StepPlan[]): Promise<StepResult>[] {
    if (this.lost) throw new Error(`Cannot run step ${plans[0]?.stepId}: ${this.lost}`);
    const maxSteps = this.stagingCpu.byteLength / this.layout.bytes;
    if (plans.length > maxSteps) {
      throw new Error(
        `Cannot run ${plans.length} plans in one submit: maxStepsPerSubmit is ${maxSteps}`,
      );
    }
    const { device } = this.gpu;
    const planned = plans.map((plan) =>
      planStep(
        plan,
        this.config,
        this.kv,
        this.layout.capacity,
        (seqId, create) => this.slotFor(seqId, create),
      )
    );
    const enc = device.createCommandEncoder({ label: `steps from ${plans[0]?.stepId}` });
    const collectors: (() => Promise<StepResult>)[] = [];
    let used = 0;
    this.masks.begin();
    planned.forEach((p, i) => {
      const plan = plans[i]!;
      const base = i * this.layout.bytes;
      const ranges = this.layout.pack(
        new DataView(this.stagingCpu.buffer, base, this.layout.bytes),
        p.content,
      );
      for (const [off, len] of ranges) {
        enc.copyBufferToBuffer(this.staging, base + off, this.meta, off, len);
      }
      used = base + this.layout.bytes;
      this.masks.encode(enc, plan);
      const rows = p.content.rows.length;
      const samples = p.content.samples.length;
      const pass = enc.beginComputePass();
      for (const op of this.rowOps) op.encode(pass, rows);
      for (const op of this.sampleOps) op.encode(pass, samples);
      pass.end();
      const readback = this.takeReadback();
      enc.copyBufferToBuffer(this.out, 0, readback, 0, Math.max(8, samples * 8));
      let logits: GPUBuffer | undefined;
      if (plan.returnLogits && samples > 0) {
        logits = device.createBuffer({
          size: samples * this.config.vocabSize * 4,
          usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
          label: "logits readback",
        });
        enc.copyBufferToBuffer(this.logits, 0, logits, 0, logits.size);
      }
      collectors.push(() => this.collect(plan, p.sampledSeqIds, readback, logits));
    });
    device.queue.writeBuffer(this.staging, 0, this.stagingCpu, 0, used);
    this.masks.flush(device.queue);
    device.queue.submit([enc.finish()]);
    // Mapping starts after the submit; nothing here waits for it, so the caller can submit again.
    return collectors.map((start) => start());
  }

  private async collect(
    plan: StepPlan,
    seqIds: readonly number[],
    readback: GPUBuffer,
    logits?: GPUBuffer,
  ): Promise<StepResult> {
    try {
      await Promise.all([readback.mapAsync(GPUMapMode.READ), logits?.mapAsync(GPUMapMode.READ)]);
    } catch (e) {
      throw new Error(`Cannot read back step ${plan.stepId}: ${this.lost ?? (e as Error).message}`);
    }
    const words = new Uint32Array(
      readback.getMappedRange(0, Math.max(8, seqIds.length * 8)).slice(0),
    );
    readback.unmap();
    this.readbacks.push(readback);
    const logprobs = new Float32Array(words.buffer);
    const all = logits ? new Float32Array(logits.getMappedRange().slice(0)) : undefined;
    logits?.destroy();
    const vocab = this.config.vocabSize;
    const sampled: SampledToken[] = seqIds.map((seqId, i) => {
      const t = { seqId, token: words[2 * i]!, logprob: logprobs[2 * i + 1]! };
      return all ? { ...t, logits: all.slice(i * vocab, (i + 1) * vocab) } : t;
    });
    return { stepId: plan.stepId, sampled };
  }

  /**
   * Runs a plan with every kernel in its own timed pass (timestamp queries) and returns each
   * kernel's GPU time, in encoding order. For benchmarks: the extra passes cost time of their own.
   */
  async profileStep(
    plan: StepPlan,
  ): Promise<{ label: string; ms: number; flops: number; bytes: number }[]> {
    if (!this.gpu.hasTimestamps) {
      throw new Error("Cannot profile: the device lacks the timestamp-query feature");
    }
    const { device } = this.gpu;
    const p = planStep(
      plan,
      this.config,
      this.kv,
      this.layout.capacity,
      (seqId, create) => this.slotFor(seqId, create),
    );
    const ops = [
      ...this.rowOps.map((op) => ({ op, n: p.content.rows.length })),
      ...this.sampleOps.map((op) => ({ op, n: p.content.samples.length })),
    ];
    const querySet = device.createQuerySet({ type: "timestamp", count: ops.length * 2 });
    const resolved = device.createBuffer({
      size: ops.length * 16,
      usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
    });
    const read = device.createBuffer({
      size: ops.length * 16,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    });
    const enc = device.createCommandEncoder();
    const ranges = this.layout.pack(
      new DataView(this.stagingCpu.buffer, 0, this.layout.bytes),
      p.content,
    );
    for (const [off, len] of ranges) enc.copyBufferToBuffer(this.staging, off, this.meta, off, len);
    ops.forEach(({ op, n }, i) => {
      const pass = enc.beginComputePass({
        timestampWrites: {
          querySet,
          beginningOfPassWriteIndex: 2 * i,
          endOfPassWriteIndex: 2 * i + 1,
        },
      });
      op.encode(pass, n);
      pass.end();
    });
    enc.resolveQuerySet(querySet, 0, ops.length * 2, resolved, 0);
    enc.copyBufferToBuffer(resolved, 0, read, 0, read.size);
    device.queue.writeBuffer(this.staging, 0, this.stagingCpu, 0, this.layout.bytes);
    device.queue.submit([enc.finish()]);
    await read.mapAsync(GPUMapMode.READ);
    const ns = new BigUint64Array(read.getMappedRange().slice(0));
    read.destroy();
    resolved.destroy();
    querySet.destroy();
    return ops.map(({ op }, i) => ({
      label: op.label,
      ms: Number(ns[2 * i + 1]! - ns[2 * i]!) / 1e6,
      ...op.cost(p.content),
    }));
  }

  /** A free readback buffer; the pool grows only to the number of steps in flight. */
  private takeReadback(): GPUBuffer {
    return this.readbacks.pop() ?? this.gpu.device.createBuffer({
      size: this.layout.capacity.maxSeqs * 8,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      label: "sampled readback",
    });
  }

  /** The device slot holding seqId's last sampled token; `create` assigns one (evicting the least recent). */
  private slotFor(seqId: number, create: boolean): number | undefined {
    let slot = this.lastSlots.get(seqId);
    if (slot !== undefined) {
      this.lastSlots.delete(seqId); // re-insert: most recently used last
      this.lastSlots.set(seqId, slot);
      return slot;
    }
    if (!create) return undefined;
    slot = this.freeSlots.pop();
    if (slot === undefined) {
      const [oldest, s] = this.lastSlots.entries().next().value!;
      this.lastSlots.delete(oldest);
      slot = s;
    }
    this.lastSlots.set(seqId, slot);
    return slot;
  }

  /** Forgets a finished or preempted sequence's last sampled token. */
  release(seqId: number): void {
    const slot = this.lastSlots.get(seqId);
    if (slot === undefined) return;
    this.lastSlots.delete(seqId);
    this.freeSlots.push(slot);
  }

  dispose(): void {
    for (const o of this.owned) o.destroy();
    for (const r of this.readbacks) r.destroy();
    this.readbacks.length = 0;
    this.lost ??= "the engine was disposed";
    if (this.ownsDevice) this.gpu.device.destroy();
  }
}
