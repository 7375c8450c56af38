import { elementCount, type Tensor } from "./tensor.ts";
import { FORMAT } from "../formats/mod.ts";

export { f16ToF32, f32ToF16 } from "../formats/half.ts";

/**
 * Expands a tensor to f32, whatever its encoding. This is the CPU reference's view of the
 * weights; GPU kernels read the raw blocks instead.
 */
export function dequantize(t: Tensor): Float32Array {
  const n = elementCount(t.shape);
  const out = new Float32Array(n);
  const { elements, bytes, decode } = FORMAT[t.type];
  const blocks = n / elements;
  if (t.data.byteLength < blocks * bytes) {
    throw new Error(
      `Cannot dequantize '${t.name}': ${t.type} [${t.shape.join(", ")}] needs ${
        blocks * bytes
      } bytes, received ${t.data.byteLength}`,
    );
  }
  decode(t.data, 0, out, 0, blocks);
  return out;
}
