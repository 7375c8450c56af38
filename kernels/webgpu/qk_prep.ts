import type { ForwardSteps } from "../../lib/model/architecture.ts";
import type { ModelConfig } from "../../lib/model/model_config.ts";
import { bindAll, type Gpu, type KernelOp } from "./device.ts";
import { DIM_ROWS } from "./step_meta.ts";

/**
 * WGSL for the architecture's optional steps between the q | k | v projection and RoPE, in
 * place on each row of `QKV`: add the q/k/v biases (qkvBias), then RMS-normalise every q head
 * and every k head with their norm weights (qkNorm). One workgroup per row; a head's sum of
 * squares is one thread's sequential loop, so a row's result never depends on the batch.
 */
export function qkPrepWgsl(config: ModelConfig, steps: ForwardSteps): string {
  const { nHeads, nKvHeads, headDim, rmsEps } = config;
  const qDim = nHeads * headDim;
  const stride = qDim + 2 * nKvHeads * headDim;
  let binding = 2;
  const decl = (name: string) =>
    `@group(0) @binding(${binding++}) var<storage, read> ${name}: array<f32>;`;
  const bias = steps.qkvBias ? decl("B") : "";
  const norms = steps.qkNorm ? `${decl("QN")}\n${decl("KN")}` : "";
  return /* wgsl */ `
@group(0) @binding(0) var<uniform> dims: vec4<u32>;
@group(0) @binding(1) var<storage, read_write> QKV: array<f32>;
${bias}
${norms}
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let r = wg.x;
  if (r >= dims[${DIM_ROWS}]) { return; }
  let base = r * ${stride}u;
  ${
    steps.qkvBias
      ? `for (var j = t; j < ${stride}u; j += 64u) { QKV[base + j] = QKV[base + j] + B[j]; }`
      : ""
  }
  ${
    steps.qkNorm
      ? `storageBarrier();
  // q heads, then k heads: head h starts at h * HD in the row (k follows q directly).
  for (var h = t; h < ${nHeads + nKvHeads}u; h += 64u) {
    let at = base + h * ${headDim}u;
    var ss = 0.0;
    for (var i = 0u; i < ${headDim}u; i++) { let v = QKV[at + i]; ss += v * v; }
    let s = 1.0 / sqrt(ss / ${headDim}.0 + ${rmsEps.toExponential()});
    for (var i = 0u; i < ${headDim}u; i++) {
      let w = select(KN[i], QN[i], h < ${nHeads}u);
      QKV[at + i] = w * (s * QKV[at + i]);
    }
  }`
      : ""
  }
}
`;
}

export interface QkPrepTarget {
  readonly dims: GPUBufferBinding | GPUBuffer;
  /** Rows of q | k | v. */
  readonly qkv: GPUBuffer;
  /** f32 q | k | v biases (qkvBias). */
  readonly bias?: GPUBuffer;
  /** f32 head-norm weights of q and of k, headDim each (qkNorm). */
  readonly qNorm?: GPUBuffer;
  readonly kNorm?: GPUBuffer;
}

/** A bound q/k/v bias + per-head norm over `rows` rows; throws when a step's buffers are missing. */
export function createQkPrep(
  gpu: Gpu,
  config: ModelConfig,
  steps: ForwardSteps,
  t: QkPrepTarget,
): KernelOp {
  if ((steps.qkvBias && !t.bias) || (steps.qkNorm && !(t.qNorm && t.kNorm))) {
    throw new Error(
      `Cannot bind q/k prep: steps ${JSON.stringify(steps)} need ${steps.qkvBias ? "bias " : ""}${
        steps.qkNorm ? "qNorm and kNorm " : ""
      }buffers`,
    );
  }
  const pipeline = gpu.pipeline(qkPrepWgsl(config, steps), "q/k prep");
  const buffers = [
    t.dims,
    t.qkv,
    ...(steps.qkvBias ? [t.bias!] : []),
    ...(steps.qkNorm ? [t.qNorm!, t.kNorm!] : []),
  ];
  const group = bindAll(gpu, pipeline, buffers, "q/k prep");
  const { nHeads, nKvHeads, headDim } = config;
  const width = (nHeads + 2 * nKvHeads) * headDim;
  return {
    label: "q/k bias+norm",
    cost: (c) => ({ flops: c.rows.length * width * 4, bytes: c.rows.length * width * 8 }),
    encode(pass: GPUComputePassEncoder, rows: number): void {
      if (rows === 0) return;
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(rows);
    },
  };
}
