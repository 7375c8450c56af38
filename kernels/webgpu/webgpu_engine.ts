import type {
  Engine,
  KvCopy,
  KvGeometry,
  SampledToken,
  StepPlan,
  StepResult,
} from "../../lib/engine/engine.ts";
import { dequantize } from "../../lib/model/dequantize.ts";
import type { ModelConfig } from "../../lib/model/model_config.ts";
import type { Tensor } from "../../lib/model/tensor.ts";
import { type ModelWeights, stepMatrixBytes } from "../../lib/model/weights.ts";
import { chooseRasterizerThreads } from "./adapter.ts";
import { acquireGpu, type Gpu, type KernelOp } from "./device.ts";
import { countDispatches } from "./dispatch_count.ts";
import { createEmbedding } from "./embedding.ts";
import {
  destroyMatrix,
  type GpuMatrix,
  type RowSource,
  uploadMatrix,
  uploadVector,
} from "./gpu_matrix.ts";
import { createClassifier } from "./classifier.ts";
import { finalNormFits } from "./matmul.ts";
import { uploadRopeTable } from "./rope.ts";
import { createSampler } from "./sample.ts";
import { LogitAdjustOp } from "./logit_adjust.ts";
import { topLogprobsBytes, TopLogprobsOp } from "./top_logprobs.ts";
import { MAX_TOP_LOGPROBS, type TopLogprobs } from "../../lib/engine/top_logprobs.ts";
import { TokenMaskUpload } from "./token_masks.ts";
import { StepMetaLayout } from "./step_meta.ts";
import { type KvPool, type LayerBuild, layerOps } from "./webgpu_layer.ts";
import { type KvDtype, kvElementBytes } from "./kv_dtype.ts";
import { type PlannedStep, planStep } from "./step_plan.ts";
import { DeferredMaps } from "./deferred_maps.ts";
import { encodeHiddenReadback, hiddenStatesFrom } from "./hidden_readback.ts";
import { DEFAULT_LIMITS } from "../../lib/engine/limits.ts";
import { kvBlockBytes, kvBlocksIn } from "../../lib/engine/kv_budget.ts";

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
  /**
   * Device slots holding each live sequence's last sampled token (default max(1024, 4 ×
   * maxSeqs)). A step that needs one more than this throws: see `release`.
   */
  readonly lastSampledSlots?: number;
  /**
   * How the KV pools hold elements: f16 (half the memory; the default where the device has
   * shader-f16) or f32.
   */
  readonly kvDtype?: KvDtype;
}

/**
 * Blocks the KV pools start with. They grow (to what a step needs, at least doubling) up to the
 * budget, so a server holds device memory for the blocks it has used, not for its cap: on a
 * software rasterizer "device memory" is the process's own.
 */
const INITIAL_KV_BLOCKS = 64;

function kvPoolUsage(): GPUBufferUsageFlags {
  return GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
}

/** The KV pools an engine holds now, and how to make bigger ones and rebind the layers to them. */
interface KvPools {
  pools: readonly KvPool[];
  capacity: number;
  /** One layer's K (or V) share of a block. */
  readonly blockBytes: number;
  readonly make: (blocks: number) => KvPool[];
  readonly build: (pools: readonly KvPool[]) => KernelOp[];
}

/**
 * The Llama forward pass as WGSL kernels over a ragged batch with a paged KV cache. Weights stay
 * in their file encoding on the device; every buffer is allocated here, once; a step is one
 * command buffer and one submit, and only the sampled ids and logprobs are read back (and the
 * rows a plan asks `hidden` for: kernels/webgpu/hidden_readback.ts). A sequence's sampled token
 * stays on the device as its next input (`useLastSampled`), so step t+1 can be submitted before
 * step t's readback arrives.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { GREEDY } from "../../lib/engine/engine.ts";
 * import { loadModel } from "../../lib/model/load_model.ts";
 *
 * const model = await loadModel("stories260K.bin");
 * const engine = await WebGpuEngine.create(model.config, model.weights, { kvBytes: 64 << 20 });
 * const seq = { seqId: 1, blockTable: [0], sample: true, sampling: GREEDY };
 * // Prefill BOS and "Once", not awaited...
 * const first = engine.step({ stepId: 0, seqs: [{ ...seq, tokens: [1, 403], startPos: 0 }] });
 * // ...so the decode is submitted at once, its input the token first samples, on the GPU.
 * const second = engine.step({
 *   stepId: 1,
 *   seqs: [{ ...seq, tokens: [], useLastSampled: true, startPos: 2 }],
 * });
 * assertEquals((await first).sampled[0]?.token, 407); // " upon", as the reference engine says
 * assertEquals((await second).sampled[0]?.token, 261); // " a"
 * engine.dispose();
 * ```
 */
export class WebGpuEngine implements Engine {
  readonly name = "webgpu";

  get limits(): { maxSeqs: number; maxBatchTokens: number } {
    return { maxSeqs: this.layout.capacity.maxSeqs, maxBatchTokens: this.layout.capacity.maxRows };
  }
  readonly kv: KvGeometry;
  /** How the KV pools hold elements. */
  readonly kvDtype: KvDtype;
  /** Bytes of device memory held, by purpose, for the start-up line. */
  readonly memory: {
    readonly weights: number;
    /** The KV budget: what the pools may grow to. */
    readonly kvCache: number;
    /** What the KV pools hold now. */
    readonly kvResident: number;
    readonly activations: number;
  };

  /** Results come back through a readback, on Deno's 10 ms mapping tick. */
  readonly resultsOnHost = false;
  /** Deno's `mapAsync` polls the device, then resolves no sooner than 10 ms later (ext/webgpu). */
  readonly readbackLatencyMs = 10;
  /** Rows a plan asks `hidden` for come back after the final norm (kernels/hidden_readback.ts). */
  readonly hiddenStates = true;
  private readonly layout: StepMetaLayout;
  private readonly staging: GPUBuffer;
  private readonly stagingCpu: Uint8Array<ArrayBuffer>;
  private readonly meta: GPUBuffer;
  private readonly out: GPUBuffer;
  private readonly logits: GPUBuffer;
  /** The residual stream, [maxRows, dim]: after the last layer, what hidden states are made of. */
  private readonly residual: GPUBuffer;
  /** The output norm's weights on the host, for hidden states. */
  private readonly outputNorm: Float32Array;
  private rowOps: KernelOp[];
  private readonly kvPools: KvPools;
  private readonly sampleOps: KernelOp[];
  private readonly adjustOp: LogitAdjustOp;
  private readonly topOp: TopLogprobsOp;
  private readonly masks: TokenMaskUpload;
  private readonly readbacks: GPUBuffer[] = [];
  private readonly maps = new DeferredMaps(GPUMapMode.READ);
  private readonly owned: { destroy(): void }[];
  /** One block's worth of one layer's K or V, for block copies; made at the first copy. */
  private kvScratch: GPUBuffer | undefined;
  /** seqId -> slot of the device table holding the token it sampled last. */
  private readonly lastSlots = new Map<number, number>();
  private readonly freeSlots: number[];
  private lost: string | undefined;
  /**
   * Compute dispatches encoded for the last plan submitted (the last of a stepMany call): the
   * figure of dispatches per step, counted as encoded.
   */
  lastStepDispatches = 0;

  private constructor(
    readonly config: ModelConfig,
    readonly gpu: Gpu,
    private readonly ownsDevice: boolean,
    parts: {
      kv: KvGeometry;
      kvDtype: KvDtype;
      layout: StepMetaLayout;
      maxStepsPerSubmit: number;
      meta: GPUBuffer;
      out: GPUBuffer;
      logits: GPUBuffer;
      residual: GPUBuffer;
      outputNorm: Float32Array;
      rowOps: KernelOp[];
      sampleOps: KernelOp[];
      adjustOp: LogitAdjustOp;
      topOp: TopLogprobsOp;
      masks: TokenMaskUpload;
      owned: { destroy(): void }[];
      slotCapacity: number;
      kvPools: KvPools;
      memory: Omit<WebGpuEngine["memory"], "kvResident">;
    },
  ) {
    this.kv = parts.kv;
    this.kvDtype = parts.kvDtype;
    this.layout = parts.layout;
    this.meta = parts.meta;
    this.out = parts.out;
    this.logits = parts.logits;
    this.residual = parts.residual;
    this.outputNorm = parts.outputNorm;
    this.rowOps = parts.rowOps;
    this.sampleOps = parts.sampleOps;
    this.adjustOp = parts.adjustOp;
    this.topOp = parts.topOp;
    this.masks = parts.masks;
    this.owned = parts.owned;
    this.kvPools = parts.kvPools;
    const kv = this.kvPools;
    this.memory = {
      ...parts.memory,
      get kvResident() {
        return 2 * kv.pools.length * kv.capacity * kv.blockBytes;
      },
    };
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
    if (!opts.gpu) chooseRasterizerThreads(stepMatrixBytes(weights));
    const gpu = opts.gpu ?? await acquireGpu();
    const { device } = gpu;
    const geometry = engineGeometry(config, weights, budget, opts, gpu);
    const { blockSize, blockBytes, numBlocks, layout, maxSeqs } = geometry;
    device.pushErrorScope("out-of-memory");
    device.pushErrorScope("validation");
    const owned: { destroy(): void }[] = [];
    const own = <T extends { destroy(): void }>(b: T): T => (owned.push(b), b);
    const uploads = weightUploads(gpu, weights, opts, own, config.dim);
    const buffer = deviceBuffers(gpu, own);
    const meta = buffer(
      layout.bytes,
      "step meta",
      GPUBufferUsage.UNIFORM | GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
    );
    const m = layout.bindings(meta);
    const slotCapacity = opts.lastSampledSlots ?? Math.max(1024, 4 * maxSeqs);
    const act = activations(config, geometry, slotCapacity, buffer);
    let up: GPUBuffer | undefined; // only when gate and up cannot share one matmul
    const embedding = uploads.upload(
      uploads.check(weights.tokenEmbedding, [config.vocabSize, config.dim]),
    );
    // Uploads made while building the layers, kept so that a rebuild for grown KV pools
    // uploads nothing again.
    const made = new Map<string, unknown>();
    // On a CPU rasterizer a tiny model's last down projection spans its rows in one workgroup,
    // so it writes the final norm of the sampled rows too: one dispatch fewer per step.
    const outputNorm = uploads.vector(weights.outputNorm);
    // (Uploaded here to ask; the layer's own upload of it finds it done.)
    const lastLayer = weights.layers.at(-1);
    const lastDown = lastLayer &&
      uploads.upload(uploads.check(lastLayer.wDown, [config.dim, config.hiddenDim]));
    const normalized = gpu.cpuRasterizer && lastDown && finalNormFits(lastDown)
      ? buffer(maxSeqs * config.dim * 4, "normalized sampled rows")
      : undefined;
    const layerBuild: LayerBuild = {
      gpu,
      config,
      blockSize,
      kvDtype: geometry.kvDtype,
      meta: m,
      act,
      ropeTable: own(uploadRopeTable(gpu, config, config.contextLength)),
      ...uploads,
      once: <T>(key: string, make: () => T): T => {
        if (!made.has(key)) made.set(key, make());
        return made.get(key) as T;
      },
      upScratch: () => up ??= buffer(geometry.maxRows * config.hiddenDim * 4, "up"),
      own,
      fail: failCreate,
      ...(normalized
        ? {
          finalNorm: {
            weight: outputNorm,
            eps: config.rmsEps,
            samples: m.samples,
            out: normalized,
          },
        }
        : {}),
    };
    const buildRowOps = (pools: readonly KvPool[]): KernelOp[] => [
      createEmbedding(gpu, embedding, {
        dims: m.dims,
        rows: m.rows,
        lastSampled: act.lastSampled,
        x: act.x,
      }),
      ...weights.layers.flatMap((w, l) => layerOps(layerBuild, l, w, pools[l]!)),
    ];
    const newPools = (blocks: number): KvPool[] =>
      weights.layers.map((_, l) => ({
        k: device.createBuffer({
          size: blocks * blockBytes,
          usage: kvPoolUsage(),
          label: `K pool ${l}`,
        }),
        v: device.createBuffer({
          size: blocks * blockBytes,
          usage: kvPoolUsage(),
          label: `V pool ${l}`,
        }),
      }));
    const kvCapacity = Math.min(numBlocks, INITIAL_KV_BLOCKS);
    const pools = newPools(kvCapacity);
    const rowOps = buildRowOps(pools);
    const masks = own(
      new TokenMaskUpload(gpu, config.vocabSize, maxSeqs, geometry.maxStepsPerSubmit),
    );
    // Penalties and bias change the classifier's output in place, before the sampler reads it.
    const adjustOp = own(new LogitAdjustOp(gpu, config.vocabSize, act.logits));
    // Only rows that ask for alternatives run it, after the adjustments.
    const topOp = own(new TopLogprobsOp(gpu, config.vocabSize, act.logits, maxSeqs));
    const sampleOps: KernelOp[] = [
      own(createClassifier(
        gpu,
        uploads.upload(uploads.check(weights.output, [config.vocabSize, config.dim])),
        {
          dims: m.dims,
          x: act.x,
          y: act.logits,
          ...(normalized ? { normalized } : { norm: { weight: outputNorm, eps: config.rmsEps } }),
          samples: m.samples,
          maxRows: maxSeqs,
        },
      )),
      adjustOp,
      createSampler(gpu, config.vocabSize, {
        dims: m.dims,
        samples: m.samples,
        logits: act.logits,
        out: act.out,
        lastSampled: act.lastSampled,
        masks,
      }),
      topOp,
    ];
    const activationBytes = Object.values(act).reduce((s, b) => s + b.size, 0) + meta.size +
      (up?.size ?? 0) + masks.buffer.size;
    const validation = await device.popErrorScope();
    const oom = await device.popErrorScope();
    if (validation || oom) {
      for (const o of owned) o.destroy();
      failCreate(`the device rejected the set-up: ${(validation ?? oom)!.message}`);
    }
    return new WebGpuEngine(config, gpu, opts.gpu === undefined, {
      kv: { numBlocks, blockSize },
      kvDtype: geometry.kvDtype,
      layout,
      maxStepsPerSubmit: geometry.maxStepsPerSubmit,
      meta,
      out: act.out,
      logits: act.logits,
      residual: act.x,
      outputNorm: dequantize(weights.outputNorm),
      rowOps,
      sampleOps,
      adjustOp,
      topOp,
      masks,
      owned,
      slotCapacity,
      kvPools: { pools, capacity: kvCapacity, blockBytes, make: newPools, build: buildRowOps },
      memory: {
        weights: uploads.bytes(),
        kvCache: numBlocks * geometry.allLayersBlockBytes,
        activations: activationBytes,
      },
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
    let submittedAt = 0;
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
    this.adjustOp.prepare(plans.map(sampledAdjustments));
    this.topOp.prepare(plans.map(sampledTopCounts));
    const enc = device.createCommandEncoder({ label: `steps from ${plans[0]?.stepId}` });
    const grown = this.growKv(plans, enc);
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
      this.copyBlocks(enc, plan.kvCopies);
      this.masks.encode(enc, plan);
      const rows = p.content.rows.length;
      const samples = p.content.samples.length;
      const counted = countDispatches(enc.beginComputePass());
      const pass = counted.pass;
      this.adjustOp.use(i);
      const asks = this.topOp.use(i);
      for (const op of this.rowOps) op.encode(pass, rows);
      for (const op of this.sampleOps) op.encode(pass, samples);
      pass.end();
      this.lastStepDispatches = counted.count();
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
      let top: GPUBuffer | undefined;
      if (asks > 0) {
        top = device.createBuffer({
          size: topLogprobsBytes(asks),
          usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
          label: "top logprobs readback",
        });
        enc.copyBufferToBuffer(this.topOp.out, 0, top, 0, top.size);
      }
      const hidden = encodeHiddenReadback(device, enc, this.residual, this.config.dim, p.hidden);
      collectors.push(() =>
        this.collect(plan, p, submittedAt, plans.length, { readback, logits, top, hidden })
      );
    });
    device.queue.writeBuffer(this.staging, 0, this.stagingCpu, 0, used);
    this.masks.flush(device.queue);
    const commands = enc.finish();
    // The earlier steps' readbacks start mapping now, so their wait on the device overlapped
    // this step's encoding (kernels/deferred_maps.ts); this step's start at the next submit.
    this.maps.flush();
    // The flush waited for any step still running: this submit's steps start now.
    submittedAt = performance.now();
    device.queue.submit([commands]);
    grown?.retire();
    return collectors.map((start) => {
      const result = start();
      return grown ? grown.checked.then(() => result) : result;
    });
  }

  /**
   * Encodes a plan's KV block copies (StepPlan.kvCopies) ahead of its kernels, through a scratch
   * block: WebGPU copies no buffer onto itself.
   */
  private copyBlocks(enc: GPUCommandEncoder, pairs: readonly KvCopy[] | undefined): void {
    if (!pairs?.length) return;
    const n = this.kvPools.blockBytes;
    const scratch = this.kvScratch ??= this.gpu.device.createBuffer({
      size: n,
      usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
      label: "KV block copy",
    });
    for (const [src, dst] of pairs) {
      for (const pool of this.kvPools.pools) {
        for (const buf of [pool.k, pool.v]) {
          enc.copyBufferToBuffer(buf, src * n, scratch, 0, n);
          enc.copyBufferToBuffer(scratch, 0, buf, dst * n, n);
        }
      }
    }
  }

  /**
   * Grows the KV pools when a plan names a block past their capacity: new pools, the old
   * contents copied in `enc` ahead of the steps, and every layer's kernels rebound to them.
   * `retire` destroys the old pools once the copies are submitted; `checked` rejects when the
   * device could not allocate the new ones.
   */
  private growKv(
    plans: readonly StepPlan[],
    enc: GPUCommandEncoder,
  ): { retire(): void; checked: Promise<void> } | undefined {
    const kv = this.kvPools;
    let need = 0;
    for (const plan of plans) {
      for (const seq of plan.seqs) for (const b of seq.blockTable) need = Math.max(need, b + 1);
      for (const [src, dst] of plan.kvCopies ?? []) need = Math.max(need, src + 1, dst + 1);
    }
    if (need <= kv.capacity) return undefined;
    const capacity = Math.min(this.kv.numBlocks, Math.max(need, 2 * kv.capacity));
    const { device } = this.gpu;
    device.pushErrorScope("out-of-memory");
    const pools = kv.make(capacity);
    const oom = device.popErrorScope();
    const old = kv.pools;
    old.forEach((p, l) => {
      enc.copyBufferToBuffer(p.k, 0, pools[l]!.k, 0, p.k.size);
      enc.copyBufferToBuffer(p.v, 0, pools[l]!.v, 0, p.v.size);
    });
    this.rowOps = kv.build(pools);
    kv.pools = pools;
    kv.capacity = capacity;
    const bytes = this.memory.kvResident;
    return {
      retire: () => old.forEach((p) => (p.k.destroy(), p.v.destroy())),
      checked: oom.then((e) => {
        if (e) {
          throw new Error(
            `Cannot grow the KV cache to ${capacity} blocks (${bytes} bytes): ${e.message}`,
          );
        }
      }),
    };
  }

  private async collect(
    plan: StepPlan,
    planned: PlannedStep,
    submittedAt: number,
    stepsInSubmit: number,
    buffers: StepReadbacks,
  ): Promise<StepResult> {
    const { readback, logits, top: topBuffer, hidden } = buffers;
    const seqIds = planned.sampledSeqIds;
    let idleAt: number;
    let mappedAt: number;
    try {
      idleAt = await this.maps.map([readback, logits, topBuffer, hidden]);
      mappedAt = performance.now();
    } catch (e) {
      hidden?.destroy();
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
    const tops = topBuffer
      ? unpackTop(plan, new Uint32Array(topBuffer.getMappedRange().slice(0)))
      : [];
    topBuffer?.destroy();
    const vocab = this.config.vocabSize;
    const sampled: SampledToken[] = seqIds.map((seqId, i) => {
      const t = { seqId, token: words[2 * i]!, logprob: logprobs[2 * i + 1]! };
      const top = tops[i];
      return {
        ...t,
        ...(all ? { logits: all.slice(i * vocab, (i + 1) * vocab) } : {}),
        ...(top ? { top } : {}),
      };
    });
    const states = hidden &&
      hiddenStatesFrom(
        new Float32Array(hidden.getMappedRange()),
        planned.hidden,
        this.outputNorm,
        this.config.rmsEps,
      );
    hidden?.destroy();
    const busyMs = Math.max(0, idleAt - submittedAt) / stepsInSubmit;
    return {
      stepId: plan.stepId,
      sampled,
      ...(states ? { hidden: states } : {}),
      busyMs,
      readbackMs: Math.max(0, mappedAt - idleAt),
    };
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
    const enc = device.createCommandEncoder();
    const grown = this.growKv([plan], enc);
    this.adjustOp.prepare([sampledAdjustments(plan)]);
    this.adjustOp.use(0);
    this.topOp.prepare([sampledTopCounts(plan)]);
    this.topOp.use(0);
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
    grown?.retire();
    await grown?.checked;
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

  /**
   * The device slot holding seqId's last sampled token; `create` assigns a free one. Running
   * out is an error, not an eviction: taking a live sequence's slot would feed it another
   * sequence's token on its next decode.
   */
  private slotFor(seqId: number, create: boolean): number | undefined {
    const slot = this.lastSlots.get(seqId);
    if (slot !== undefined || !create) return slot;
    const free = this.freeSlots.pop();
    if (free === undefined) {
      throw new Error(
        `Cannot keep sequence ${seqId}'s sampled token on the device: all ${this.lastSlots.size} last-sampled slots are held by sequences not released (call release() for every sequence that ended or was preempted, or raise lastSampledSlots)`,
      );
    }
    this.lastSlots.set(seqId, free);
    return free;
  }

  /** Forgets a finished or preempted sequence's last sampled token. */
  release(seqId: number): void {
    const slot = this.lastSlots.get(seqId);
    if (slot === undefined) return;
    this.lastSlots.delete(seqId);
    this.freeSlots.push(slot);
  }

  dispose(): void {
    this.maps.flush();
    for (const o of this.owned) o.destroy();
    for (const p of this.kvPools.pools) (p.k.destroy(), p.v.destroy());
    this.kvScratch?.destroy();
    for (const r of this.readbacks) r.destroy();
    this.readbacks.length = 0;
    this.lost ??= "the engine was disposed";
    if (this.ownsDevice) this.gpu.device.destroy();
  }
}

function failCreate(why: string): never {
  throw new Error(`Cannot create WebGPU engine: ${why}`);
}

/** The KV and step geometry an engine is created with, checked against the model and the device. */
interface EngineGeometry {
  readonly blockSize: number;
  readonly kvDtype: KvDtype;
  /** One layer's K (or V) share of a block. */
  readonly blockBytes: number;
  /** A block over all layers, K and V. */
  readonly allLayersBlockBytes: number;
  readonly numBlocks: number;
  readonly maxRows: number;
  readonly maxSeqs: number;
  readonly maxStepsPerSubmit: number;
  readonly layout: StepMetaLayout;
}

/**
 * Validates the KV budget, the head layout and the layer count, and derives the step layout.
 * Throws naming what was wrong and what would fit.
 */
function engineGeometry(
  config: ModelConfig,
  weights: ModelWeights,
  budget: KvBudget,
  opts: WebGpuEngineOptions,
  gpu: Gpu,
): EngineGeometry {
  const { nLayers, nHeads, nKvHeads, headDim } = config;
  const blockSize = budget.blockSize ?? DEFAULT_LIMITS.blockSize;
  const kvDtype = opts.kvDtype ?? (gpu.hasShaderF16 ? "f16" : "f32");
  if (kvDtype === "f16" && !gpu.hasShaderF16) {
    failCreate(
      `an f16 KV cache needs the device's shader-f16 feature, which ${gpu.description} lacks; use kvDtype f32`,
    );
  }
  const element = kvElementBytes(kvDtype);
  const blockBytes = blockSize * nKvHeads * headDim * element;
  const allLayersBlockBytes = kvBlockBytes(config, blockSize, element);
  const numBlocks = budget.numBlocks ??
    kvBlocksIn(budget.kvBytes ?? 0, config, blockSize, element);
  if (
    !(Number.isInteger(numBlocks) && numBlocks > 0 && Number.isInteger(blockSize) &&
      blockSize > 0)
  ) {
    failCreate(
      `the KV budget gives ${numBlocks} blocks of ${blockSize} tokens; pass numBlocks or kvBytes (at least ${allLayersBlockBytes} bytes, one block)`,
    );
  }
  if (numBlocks * blockBytes > gpu.maxBindingBytes) {
    failCreate(
      `one layer's K pool of ${numBlocks} blocks needs ${
        numBlocks * blockBytes
      } bytes, above the device's binding limit of ${gpu.maxBindingBytes}; lower the KV budget to at most ${
        Math.floor(gpu.maxBindingBytes / blockBytes) * allLayersBlockBytes
      } bytes`,
    );
  }
  if (nHeads % nKvHeads !== 0 || headDim % 2 !== 0 || config.ropeDim > headDim) {
    failCreate(
      `unsupported head layout: ${nHeads} query heads, ${nKvHeads} KV heads, head size ${headDim}, RoPE dims ${config.ropeDim}`,
    );
  }
  if (weights.layers.length !== nLayers) {
    failCreate(`the config says ${nLayers} layers, the weights hold ${weights.layers.length}`);
  }
  const maxRows = opts.maxBatchTokens ?? DEFAULT_LIMITS.maxBatchTokens;
  const maxSeqs = opts.maxSeqs ?? DEFAULT_LIMITS.maxRunning;
  const blocksPerSeq = Math.min(numBlocks, Math.ceil(config.contextLength / blockSize));
  return {
    blockSize,
    kvDtype,
    blockBytes,
    allLayersBlockBytes,
    numBlocks,
    maxRows,
    maxSeqs,
    maxStepsPerSubmit: opts.maxStepsPerSubmit ?? DEFAULT_LIMITS.maxStepsPerSubmit,
    layout: new StepMetaLayout({ maxRows, maxSeqs, maxTableEntries: maxSeqs * blocksPerSeq }),
  };
}

/** Uploads each weight tensor once, reporting progress; `bytes` is what they hold on the device. */
function weightUploads(
  gpu: Gpu,
  weights: ModelWeights,
  opts: WebGpuEngineOptions,
  own: <T extends { destroy(): void }>(b: T) => T,
  dim: number,
) {
  const matrices = new Map<Tensor | RowSource, GpuMatrix>();
  const allWeights = new Set<Tensor>([weights.tokenEmbedding, weights.output]);
  for (const w of weights.layers) {
    for (const t of [w.wq, w.wk, w.wv, w.wo, w.wGate, w.wUp, w.wDown]) allWeights.add(t);
  }
  const uploadTotal = [...allWeights].reduce((n, t) => n + t.data.byteLength, 0);
  let uploaded = 0;
  const check = (t: Tensor, shape: readonly number[]): Tensor => {
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      failCreate(
        `tensor '${t.name}' has shape [${t.shape.join(", ")}], expected [${shape.join(", ")}]`,
      );
    }
    return t;
  };
  return {
    check,
    upload(t: Tensor | RowSource): GpuMatrix {
      let mm = matrices.get(t);
      if (!mm) {
        const created = uploadMatrix(gpu, t);
        uploaded = Math.min(
          uploadTotal,
          uploaded + ("copyRows" in t ? t.byteLength : t.data.byteLength),
        );
        opts.onUpload?.(uploaded, uploadTotal);
        matrices.set(t, created);
        own({ destroy: () => destroyMatrix(created) });
        mm = created;
      }
      return mm;
    },
    vector(t: Tensor, length = dim): GPUBuffer {
      return own(uploadVector(gpu, dequantize(check(t, [length])), t.name));
    },
    bytes(): number {
      return [...matrices.values()].reduce(
        (s, mm) => s + mm.chunks.reduce((a, c) => a + c.buffer.size, 0),
        0,
      );
    },
  };
}

/** A storage-buffer maker that refuses sizes past the device's binding limit. */
function deviceBuffers(gpu: Gpu, own: <T extends { destroy(): void }>(b: T) => T) {
  return (
    bytes: number,
    label: string,
    usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC,
  ): GPUBuffer => {
    if (bytes > gpu.maxBindingBytes) {
      failCreate(
        `buffer '${label}' needs ${bytes} bytes, above the device's binding limit of ${gpu.maxBindingBytes}; lower maxBatchTokens or maxSeqs`,
      );
    }
    return own(
      gpu.device.createBuffer({ size: Math.max(16, Math.ceil(bytes / 4) * 4), usage, label }),
    );
  };
}

/** Every activation buffer of a step, sized for the geometry's rows and sequences. */
function activations(
  config: ModelConfig,
  g: EngineGeometry,
  slotCapacity: number,
  buffer: (bytes: number, label: string) => GPUBuffer,
) {
  const qDim = config.nHeads * config.headDim;
  const qkvStride = qDim + 2 * config.nKvHeads * config.headDim;
  return {
    x: buffer(g.maxRows * config.dim * 4, "x"),
    qkv: buffer(g.maxRows * qkvStride * 4, "qkv"),
    att: buffer(g.maxRows * qDim * 4, "att"),
    hidden: buffer(g.maxRows * config.hiddenDim * 4, "hidden"),
    logits: buffer(g.maxSeqs * config.vocabSize * 4, "logits"),
    out: buffer(g.maxSeqs * 8, "sampled"),
    lastSampled: buffer(slotCapacity * 4, "last sampled"),
  };
}

/** The buffers a step's results are read back from (logits, top and hidden only if asked). */
interface StepReadbacks {
  readonly readback: GPUBuffer;
  readonly logits: GPUBuffer | undefined;
  readonly top: GPUBuffer | undefined;
  readonly hidden: GPUBuffer | undefined;
}

/** Each sampled row's logit adjustments, in sample order (what the adjust kernel's rows are). */
function sampledAdjustments(plan: StepPlan) {
  return plan.seqs.filter((s) => s.sample).map((s) => s.adjust);
}

/** Each sampled row's top-logprobs count, in sample order. */
function sampledTopCounts(plan: StepPlan) {
  return plan.seqs.filter((s) => s.sample).map((s) => s.topLogprobs);
}

/** The top-logprobs results of a plan's asking rows, by sample index. */
function unpackTop(plan: StepPlan, words: Uint32Array): (TopLogprobs | undefined)[] {
  const f32 = new Float32Array(words.buffer);
  const out: (TopLogprobs | undefined)[] = [];
  let a = 0;
  for (const n of sampledTopCounts(plan)) {
    if (!n) {
      out.push(undefined);
      continue;
    }
    const ids: number[] = [], logprobs: number[] = [];
    for (let k = 0; k < n; k++) {
      const w = 2 * (a * MAX_TOP_LOGPROBS + k);
      if (words[w] === 0xffffffff) break;
      ids.push(words[w]!);
      logprobs.push(f32[w + 1]!);
    }
    out.push({ ids, logprobs });
    a++;
  }
  return out;
}
