/**
 * A compute pass that counts the dispatches encoded into it, so the engine can report how many
 * a step took (issue 17's figure: per layer, and fixed per step) from what was really encoded,
 * not from a formula that could drift from the kernels.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { acquireGpu } from "./device.ts";
 *
 * const gpu = await acquireGpu();
 * const enc = gpu.device.createCommandEncoder();
 * const counted = countDispatches(enc.beginComputePass());
 * counted.pass.end(); // no kernel encoded
 * assertEquals(counted.count(), 0);
 * ```
 */
export function countDispatches(
  pass: GPUComputePassEncoder,
): { pass: GPUComputePassEncoder; count(): number } {
  let n = 0;
  const counted = new Proxy(pass, {
    get(target, key) {
      const value = Reflect.get(target, key, target);
      if (typeof value !== "function") return value;
      // WebGPU's methods check their receiver: call them on the real encoder.
      if (key === "dispatchWorkgroups" || key === "dispatchWorkgroupsIndirect") {
        return (...args: unknown[]) => {
          n++;
          return value.apply(target, args);
        };
      }
      return value.bind(target);
    },
  });
  return { pass: counted, count: () => n };
}
