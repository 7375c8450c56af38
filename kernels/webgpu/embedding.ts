import { bindAll, type Gpu, type KernelOp, uploadBuffer } from "./device.ts";
import type { GpuMatrix } from "./gpu_matrix.ts";
import { DIM_ROWS, LAST_SAMPLED_FLAG, WGSL_STEP_TYPES } from "./step_meta.ts";
import {
  chunkElements,
  chunkVec4s,
  needsVec4View,
  wgslLoadChunk,
  wgslWeights,
} from "./weight_formats.ts";

/**
 * WGSL gathering each row's token embedding, dequantized from the file encoding by the same
 * chunk readers as the matmuls (one thread per chunk of 4 or 32 elements), so a quantized
 * table stays quantized on the device. A row whose token carries LAST_SAMPLED_FLAG reads the
 * id the sampler left on the device, so a decode step needs no readback of the previous one.
 */
export function embeddingWgsl(m: GpuMatrix): string {
  const per = chunkElements(m.type);
  const nv = chunkVec4s(m.type);
  const stores = Array.from({ length: nv }, (_, i) => `X[base + ${i}u] = ed * e${i};`).join(" ");
  return /* wgsl */ `
${WGSL_STEP_TYPES}
struct Chunk { rowStart: u32, rows: u32, unused0: u32, unused1: u32 }
@group(0) @binding(0) var<uniform> dims: vec4<u32>;
@group(0) @binding(1) var<uniform> chunk: Chunk;
${wgslWeights(m.type, 6)}
@group(0) @binding(3) var<storage, read> rows: array<Row>;
@group(0) @binding(4) var<storage, read> lastSampled: array<u32>;
@group(0) @binding(5) var<storage, read_write> X: array<vec4<f32>>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let r = wg.y;
  let c = wg.x * 64u + t;
  if (r >= dims[${DIM_ROWS}] || c >= ${m.cols / per}u) { return; }
  var token = rows[r].token;
  if ((token & ${LAST_SAMPLED_FLAG}u) != 0u) { token = lastSampled[token & ${
    LAST_SAMPLED_FLAG - 1
  }u]; }
  if (token >= chunk.rowStart && token - chunk.rowStart < chunk.rows) {
    let o = token - chunk.rowStart;
    ${wgslLoadChunk(m.type, m.cols, "o", "e", m.group)}
    let base = r * ${m.cols / 4}u + c * ${nv}u;
    ${stores}
  }
}
`;
}

/** Buffers the embedding gather reads and writes. */
export interface EmbeddingTarget {
  readonly dims: GPUBufferBinding | GPUBuffer;
  readonly rows: GPUBufferBinding | GPUBuffer;
  readonly lastSampled: GPUBuffer;
  readonly x: GPUBuffer;
}

/** A bound embedding gather: x[r, :] = E[token(r), :] for r < rows. */
export function createEmbedding(gpu: Gpu, m: GpuMatrix, target: EmbeddingTarget): KernelOp {
  const pipeline = gpu.pipeline(embeddingWgsl(m), `embedding ${m.type}`);
  const groups = m.chunks.map((c) =>
    bindAll(gpu, pipeline, [
      target.dims,
      uploadBuffer(
        gpu,
        new Uint32Array([c.rowStart, c.rows, 0, 0]),
        GPUBufferUsage.UNIFORM,
        `${m.name} chunk`,
      ),
      c.buffer,
      target.rows,
      target.lastSampled,
      target.x,
      ...(needsVec4View(m.type) ? [c.buffer] : []),
    ])
  );
  return {
    label: `embedding ${m.type}`,
    cost: (c) => ({ flops: 0, bytes: c.rows.length * (m.rowBytes + m.cols * 4) }),
    encode(pass: GPUComputePassEncoder, rows: number): void {
      if (rows === 0) return;
      pass.setPipeline(pipeline);
      for (const g of groups) {
        pass.setBindGroup(0, g);
        pass.dispatchWorkgroups(Math.ceil(m.cols / chunkElements(m.type) / 64), rows);
      }
    },
  };
}
