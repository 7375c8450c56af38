import { dequantize } from "../../lib/model/dequantize.ts";
import { NO_EXTRA_STEPS } from "../../lib/model/architecture.ts";
import type { ModelConfig } from "../../lib/model/model_config.ts";
import type { Tensor } from "../../lib/model/tensor.ts";
import type { LayerWeights } from "../../lib/model/weights.ts";
import { createAttention } from "./attention.ts";
import type { Gpu, KernelOp } from "./device.ts";
import {
  concatRows,
  type GpuMatrix,
  interleaveRows,
  type RowSource,
  stackable,
  uploadVector,
} from "./gpu_matrix.ts";
import { createMatmul, laneShape, type MatmulTarget } from "./matmul.ts";
import { createQkPrep } from "./qk_prep.ts";
import { createRopeStore } from "./rope.ts";
import { DIM_ROWS, type StepMetaLayout } from "./step_meta.ts";
import { createSwiglu } from "./swiglu.ts";
import type { KvDtype } from "./kv_dtype.ts";

/** One layer's K and V pools. */
export interface KvPool {
  readonly k: GPUBuffer;
  readonly v: GPUBuffer;
}

/** The activation buffers a layer reads and writes (allocated once, for maxRows rows). */
export interface LayerActivations {
  /** The residual stream, [rows, dim]. */
  readonly x: GPUBuffer;
  /** q | k | v per row, [rows, qDim + 2·kvDim]. */
  readonly qkv: GPUBuffer;
  /** Attention output, [rows, qDim]. */
  readonly att: GPUBuffer;
  /** The FFN's hidden rows, [rows, hiddenDim]. */
  readonly hidden: GPUBuffer;
}

/**
 * What building a layer's kernels needs from the engine being created: the device, the step
 * meta bindings, the activations, and uploads that happen once per tensor, so that a rebuild
 * for grown KV pools binds the same weight buffers again.
 */
export interface LayerBuild {
  readonly gpu: Gpu;
  readonly config: ModelConfig;
  readonly blockSize: number;
  readonly kvDtype: KvDtype;
  readonly meta: ReturnType<StepMetaLayout["bindings"]>;
  readonly act: LayerActivations;
  readonly ropeTable: GPUBuffer;
  /** A weight matrix on the device (uploaded on first use). */
  readonly upload: (t: Tensor | RowSource) => GpuMatrix;
  /** Memoizes an upload under a key: built on the first build, reused on rebuilds. */
  readonly once: <T>(key: string, make: () => T) => T;
  /** A norm or bias vector on the device, dequantized to f32, with its shape checked. */
  readonly vector: (t: Tensor, length?: number) => GPUBuffer;
  /** The tensor, after checking its shape (throws naming the tensor otherwise). */
  readonly check: (t: Tensor, shape: readonly number[]) => Tensor;
  /** The separate `up` activation, for encodings where gate and up cannot share a matmul. */
  readonly upScratch: () => GPUBuffer;
  /** Keeps a buffer to destroy with the engine. */
  readonly own: (b: GPUBuffer) => GPUBuffer;
  /** The final norm in the last layer's down projection (MatmulTarget.finalNorm), if it fits. */
  readonly finalNorm?: MatmulTarget["finalNorm"];
  readonly fail: (why: string) => never;
}

/**
 * Layer l's kernels, in order: the q/k/v projection with its norm, biases, RoPE and the KV
 * store fused (with q/k norms, which need whole heads, the projection, the norm kernel and RoPE
 * + KV store apart), attention over the paged cache (on CPU rasterizers, where it fits, in the
 * output projection's prologue), the output projection adding into the residual, the gate/up
 * projection with SwiGLU in its epilogue, and the down projection adding into the residual.
 */
export function layerOps(b: LayerBuild, l: number, w: LayerWeights, pool: KvPool): KernelOp[] {
  const { gpu, config, blockSize, kvDtype, act, ropeTable, upload, once, vector, check, fail } = b;
  const m = b.meta;
  const { dim, hiddenDim, nHeads, nKvHeads, headDim, rmsEps } = config;
  const qDim = nHeads * headDim;
  const kvDim = nKvHeads * headDim;
  const qkvStride = qDim + 2 * kvDim;
  const steps = config.steps ?? NO_EXTRA_STEPS;
  const rows = { dims: m.dims, rowsField: DIM_ROWS };
  const present = (t: Tensor | undefined, what: string): Tensor =>
    t ?? fail(`the ${what} step is on but layer ${l} has no ${what} tensors`);
  const ops: KernelOp[] = [];
  const { k: kCache, v: vCache } = pool;
  // q, k and v: one matmul over the stacked rows when the encodings allow, with the norm fused.
  const attnNorm = { weight: once(`${l}.attn_norm`, () => vector(w.attnNorm)), eps: rmsEps };
  const qkv = [
    check(w.wq, [qDim, dim]),
    check(w.wk, [kvDim, dim]),
    check(w.wv, [kvDim, dim]),
  ];
  const qkvBias = steps.qkvBias
    ? once(`${l}.qkv_bias`, () => {
      const parts = [
        dequantize(check(present(w.qBias, "qkvBias"), [qDim])),
        dequantize(check(present(w.kBias, "qkvBias"), [kvDim])),
        dequantize(check(present(w.vBias, "qkvBias"), [kvDim])),
      ];
      const all = new Float32Array(qkvStride);
      all.set(parts[0]!, 0);
      all.set(parts[1]!, qDim);
      all.set(parts[2]!, qDim + kvDim);
      return b.own(uploadVector(gpu, all, `blk.${l}.qkv_bias`));
    })
    : undefined;
  // q/k norms run between the projection and RoPE (over whole heads), so they rule out the
  // fusion; a bias is added in the epilogue.
  const fuseRope = !steps.qkNorm;
  if (fuseRope) {
    // The matmuls rotate q and k and store k and v themselves: no RoPE dispatch. One matmul
    // per run of q, k, v whose encodings stack (all three in most files).
    for (const run of stackRuns(qkv, [0, qDim, qDim + kvDim])) {
      const key = run.parts.length === 3 ? `${l}.qkv` : `${l}.qkv@${run.offset}`;
      const name = `blk.${l}.${run.parts.length === 3 ? "qkv" : `qkv@${run.offset}`}`;
      const matrix = once(
        key,
        () => upload(run.parts.length === 1 ? run.parts[0]! : concatRows(run.parts, name)),
      );
      ops.push(
        createMatmul(gpu, matrix, {
          ...rows,
          x: act.x,
          y: act.qkv,
          yStride: qkvStride,
          yOffset: run.offset,
          norm: attnNorm,
          epilogue: "rope",
          rope: {
            shape: {
              qDim,
              kvDim,
              headDim,
              ropeDim: config.ropeDim,
              kvDtype,
              bias: qkvBias !== undefined,
            },
            rows: m.rows,
            table: ropeTable,
            kCache,
            vCache,
            ...(qkvBias ? { bias: qkvBias } : {}),
          },
          label: run.parts.length === 3 ? "qkv+rope+kv store" : "q|k|v+rope+kv store",
        }),
      );
    }
  } else if (stackable(qkv)) {
    ops.push(
      createMatmul(gpu, once(`${l}.qkv`, () => upload(concatRows(qkv, `blk.${l}.qkv`))), {
        ...rows,
        x: act.x,
        y: act.qkv,
        norm: attnNorm,
        label: "qkv",
      }),
    );
  } else {
    [0, qDim, qDim + kvDim].forEach((yOffset, i) => {
      ops.push(
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
  if (!fuseRope && (steps.qkvBias || steps.qkNorm)) {
    const bias = qkvBias;
    ops.push(createQkPrep(gpu, config, steps, {
      dims: m.dims,
      qkv: act.qkv,
      ...(bias ? { bias } : {}),
      ...(steps.qkNorm
        ? {
          qNorm: once(`${l}.q_norm`, () => vector(present(w.qNorm, "qkNorm"), headDim)),
          kNorm: once(`${l}.k_norm`, () => vector(present(w.kNorm, "qkNorm"), headDim)),
        }
        : {}),
    }));
  }
  if (!fuseRope) {
    ops.push(
      createRopeStore(gpu, config, {
        dims: m.dims,
        rows: m.rows,
        table: ropeTable,
        qkv: act.qkv,
        kCache,
        vCache,
        kvDtype,
      }),
    );
  }
  const wo = upload(check(w.wo, [dim, qDim]));
  if (attentionInWo(gpu, config, wo)) {
    ops.push(createMatmul(gpu, wo, {
      ...rows,
      x: act.qkv,
      y: act.x,
      epilogue: "accumulate",
      attention: {
        shape: { config, blockSize, kvDtype },
        rows: m.rows,
        seqs: m.seqs,
        tables: m.tables,
        kCache,
        vCache,
      },
      layout: "lane",
      label: "attention+wo",
    }));
  } else {
    ops.push(
      createAttention(gpu, config, blockSize, {
        dims: m.dims,
        rows: m.rows,
        seqs: m.seqs,
        tables: m.tables,
        qkv: act.qkv,
        kCache,
        vCache,
        kvDtype,
        out: act.att,
      }),
      createMatmul(gpu, wo, {
        ...rows,
        x: act.att,
        y: act.x,
        epilogue: "accumulate",
        label: "wo",
      }),
    );
  }
  const ffnNorm = { weight: once(`${l}.ffn_norm`, () => vector(w.ffnNorm)), eps: rmsEps };
  const gate = check(w.wGate, [hiddenDim, dim]);
  const upT = check(w.wUp, [hiddenDim, dim]);
  if (stackable([gate, upT])) {
    const gateUp = once(
      `${l}.gate_up`,
      () => upload(interleaveRows(gate, upT, `blk.${l}.gate_up`)),
    );
    ops.push(
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
    const up = b.upScratch();
    ops.push(
      createMatmul(gpu, upload(gate), {
        ...rows,
        x: act.x,
        y: act.hidden,
        norm: ffnNorm,
        label: "gate",
      }),
      createMatmul(gpu, upload(upT), {
        ...rows,
        x: act.x,
        y: up,
        norm: ffnNorm,
        label: "up",
      }),
      createSwiglu(gpu, hiddenDim, { dims: m.dims, gate: act.hidden, up }),
    );
  }
  ops.push(
    createMatmul(gpu, upload(check(w.wDown, [dim, hiddenDim])), {
      ...rows,
      x: act.hidden,
      y: act.x,
      epilogue: "accumulate",
      label: "down",
      ...(b.finalNorm && l === config.nLayers - 1
        ? { finalNorm: b.finalNorm, layout: "lane" as const, label: "down+final norm" }
        : {}),
    }),
  );
  return ops;
}

/**
 * Attention runs as the output projection's prologue (one dispatch fewer per layer) on a CPU
 * rasterizer when one lane workgroup spans all of wo's outputs, so no attention is computed
 * twice, and a tile's attention rows fit the 16 KiB of workgroup memory WebGPU guarantees.
 */
function attentionInWo(gpu: Gpu, config: ModelConfig, wo: GpuMatrix): boolean {
  const { threads, outs, rows } = laneShape(wo.type);
  const qDim = config.nHeads * config.headDim;
  return gpu.cpuRasterizer && config.headDim % 4 === 0 && wo.chunks.length === 1 &&
    threads * outs >= wo.rows && rows * qDim * 4 <= 16384;
}

/**
 * q, k and v as runs of consecutive tensors one matmul can stack (same encoding and row
 * length), each with the q | k | v feature its first row writes.
 */
function stackRuns(
  parts: readonly Tensor[],
  offsets: readonly number[],
): { parts: Tensor[]; offset: number }[] {
  const runs: { parts: Tensor[]; offset: number }[] = [];
  parts.forEach((t, i) => {
    const last = runs.at(-1);
    if (last && stackable([...last.parts, t])) last.parts.push(t);
    else runs.push({ parts: [t], offset: offsets[i]! });
  });
  return runs;
}
