/**
 * Hidden states (SeqInput.hidden) on the WebGPU engine: the asked rows of the residual stream
 * are copied, after the step's last layer, into one readback buffer, and the final RMS norm is
 * applied on the host (lib/engine/final_norm.ts), in float64 sums as the cpu engine applies it.
 *
 * Why on the host: the rows must come back anyway (dim floats each, normalized or not), the
 * norm is a pass over them, and the steps that ask for none encode nothing more. On the device
 * the final norm lives only inside the classifier's prologue, or on a CPU rasterizer in the
 * last down projection's epilogue, and both are for sampled rows alone: an embedding step may
 * hold hundreds of rows and sample none.
 */
import type { HiddenStates } from "../../lib/engine/engine.ts";
import { finalNormRows } from "../../lib/engine/final_norm.ts";
import type { HiddenRange } from "./step_plan.ts";

/**
 * Encodes the copies of `ranges`' rows of the residual stream `x` ([rows, dim] f32) into a new
 * mappable buffer, packed in plan order; undefined when no row is asked for.
 */
export function encodeHiddenReadback(
  device: GPUDevice,
  enc: GPUCommandEncoder,
  x: GPUBuffer,
  dim: number,
  ranges: readonly HiddenRange[],
): GPUBuffer | undefined {
  const rows = ranges.reduce((n, r) => n + r.count, 0);
  if (rows === 0) return undefined;
  const rowBytes = dim * 4;
  const buffer = device.createBuffer({
    size: rows * rowBytes,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    label: "hidden states readback",
  });
  let at = 0;
  for (const r of ranges) {
    enc.copyBufferToBuffer(x, r.row * rowBytes, buffer, at, r.count * rowBytes);
    at += r.count * rowBytes;
  }
  return buffer;
}

/**
 * Each range's rows after the final norm, from the mapped readback's contents (`rows`, packed
 * as encodeHiddenReadback packs them) and the output norm's weights.
 */
export function hiddenStatesFrom(
  rows: Float32Array,
  ranges: readonly HiddenRange[],
  outputNorm: Float32Array,
  eps: number,
): HiddenStates[] {
  const normed = finalNormRows(rows, outputNorm, eps);
  const dim = outputNorm.length;
  let at = 0;
  return ranges.map((r) => {
    const out = normed.slice(at, at + r.count * dim);
    at += r.count * dim;
    return { seqId: r.seqId, startPos: r.startPos, rows: out };
  });
}
