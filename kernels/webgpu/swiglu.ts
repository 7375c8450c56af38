import { bindAll, type Gpu, type KernelOp } from "./device.ts";
import { DIM_ROWS } from "./step_meta.ts";

/** WGSL for gate = silu(gate) * up, elementwise over the step's rows of `hidden` features. */
export function swigluWgsl(hidden: number): string {
  return /* wgsl */ `
@group(0) @binding(0) var<uniform> dims: vec4<u32>;
@group(0) @binding(1) var<storage, read_write> G: array<f32>;
@group(0) @binding(2) var<storage, read> U: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let j = wg.x * 64u + t;
  if (wg.y >= dims[${DIM_ROWS}] || j >= ${hidden}u) { return; }
  let i = wg.y * ${hidden}u + j;
  let g = G[i];
  G[i] = g / (1.0 + exp(-g)) * U[i];
}
`;
}

export interface SwigluTarget {
  readonly dims: GPUBufferBinding | GPUBuffer;
  readonly gate: GPUBuffer;
  readonly up: GPUBuffer;
}

/** A bound SwiGLU over `rows` rows. */
export function createSwiglu(gpu: Gpu, hidden: number, target: SwigluTarget): KernelOp {
  const pipeline = gpu.pipeline(swigluWgsl(hidden), "swiglu");
  const group = bindAll(gpu, pipeline, [target.dims, target.gate, target.up], "swiglu");
  return {
    label: "swiglu",
    cost: (c) => ({ flops: 6 * c.rows.length * hidden, bytes: 3 * c.rows.length * hidden * 4 }),
    encode(pass: GPUComputePassEncoder, rows: number): void {
      if (rows === 0) return;
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(Math.ceil(hidden / 64), rows);
    },
  };
}
