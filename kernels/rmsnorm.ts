import { bindAll, type Gpu } from "./device.ts";
import { WGSL_STEP_TYPES } from "./step_meta.ts";

/**
 * WGSL for y[i] = w * x[src(i)] / sqrt(mean(x²) + eps), one workgroup per row. With `gather`,
 * row i reads the activation row named by samples[i].row (the final norm runs only on the rows
 * that are sampled). Each thread sums a fixed strided set, then the partials are added in
 * thread order, so a row's result is independent of the batch.
 */
export function rmsnormWgsl(dim: number, eps: number, rowsField: number, gather: boolean): string {
  return /* wgsl */ `
${WGSL_STEP_TYPES}
@group(0) @binding(0) var<uniform> dims: vec4<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
${gather ? "@group(0) @binding(4) var<storage, read> samples: array<Sample>;" : ""}
var<workgroup> part: array<f32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let i = wg.x;
  if (i >= dims[${rowsField}]) { return; }
  let src = ${gather ? "samples[i].row" : "i"} * ${dim}u;
  var ss = 0.0;
  for (var j = t; j < ${dim}u; j += 64u) { let v = X[src + j]; ss += v * v; }
  part[t] = ss;
  workgroupBarrier();
  var total = 0.0;
  for (var k = 0u; k < 64u; k++) { total += part[k]; }
  let scale = 1.0 / sqrt(total / ${dim}.0 + ${eps.toExponential()});
  for (var j = t; j < ${dim}u; j += 64u) { Y[i * ${dim}u + j] = w[j] * (scale * X[src + j]); }
}
`;
}

export interface RmsnormTarget {
  readonly dims: GPUBufferBinding | GPUBuffer;
  readonly x: GPUBuffer;
  readonly weight: GPUBuffer;
  readonly y: GPUBuffer;
  readonly rowsField: number;
  /** Present for the final norm: row i reads samples[i].row. */
  readonly samples?: GPUBufferBinding | GPUBuffer;
}

/** A bound RMSNorm over `rows` rows. */
export function createRmsnorm(gpu: Gpu, dim: number, eps: number, target: RmsnormTarget) {
  const gather = target.samples !== undefined;
  const pipeline = gpu.pipeline(rmsnormWgsl(dim, eps, target.rowsField, gather), "rmsnorm");
  const buffers = [target.dims, target.x, target.weight, target.y];
  if (target.samples) buffers.push(target.samples);
  const group = bindAll(gpu, pipeline, buffers, "rmsnorm");
  return {
    encode(pass: GPUComputePassEncoder, rows: number): void {
      if (rows === 0) return;
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(rows);
    },
  };
}
