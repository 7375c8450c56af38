/**
 * Prints the default WebGPU adapter as markdown: its info, the features the engine looks for,
 * and the limits it plans around. The first section of bench/gpu.sh. Uses no npm packages.
 *
 *   deno run --allow-all bench/adapter_info.ts
 */
import { isCpuRasterizer } from "../kernels/webgpu/adapter.ts";

const adapter = await navigator.gpu?.requestAdapter({ powerPreference: "high-performance" });
if (!adapter) {
  console.error("adapter_info: no WebGPU adapter (is a Vulkan driver installed?)");
  Deno.exit(1);
}
const { info, limits, features } = adapter;
const rows: [string, string][] = [
  ["vendor", info.vendor],
  ["architecture", info.architecture],
  ["device", info.device],
  ["description", info.description],
  ["software rasterizer", String(isCpuRasterizer(info))],
  ["shader-f16", String(features.has("shader-f16"))],
  ["timestamp-query", String(features.has("timestamp-query"))],
  ["maxStorageBufferBindingSize", `${limits.maxStorageBufferBindingSize}`],
  ["maxBufferSize", `${limits.maxBufferSize}`],
  ["maxComputeWorkgroupsPerDimension", `${limits.maxComputeWorkgroupsPerDimension}`],
  ["maxComputeInvocationsPerWorkgroup", `${limits.maxComputeInvocationsPerWorkgroup}`],
];
console.log("| adapter | |\n|---|---|");
for (const [k, v] of rows) console.log(`| ${k} | ${v || "-"} |`);
