import type { StepContent } from "./step_meta.ts";
import {
  isCpuRasterizer,
  laneSubgroupsFit,
  rasterizerInline,
  requestDefaultAdapter,
} from "./adapter.ts";

/**
 * The WebGPU device and what every kernel needs from it: the limits actually granted, and a
 * cache so each WGSL program is compiled once per device.
 */

/** A device with the limits the kernels plan around. */
export interface Gpu {
  readonly device: GPUDevice;
  /** Adapter description for start-up logs, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)". */
  readonly description: string;
  /** Largest byte range one storage binding may cover (and one buffer may hold). */
  readonly maxBindingBytes: number;
  readonly maxStorageBuffersPerStage: number;
  readonly maxWorkgroupsPerDimension: number;
  readonly hasShaderF16: boolean;
  readonly hasTimestamps: boolean;
  /**
   * A software rasterizer on the CPU (Mesa llvmpipe/lavapipe, SwiftShader, WARP): kernels pick
   * layouts without workgroup barriers and with activation reads shared by every SIMD lane.
   */
  readonly cpuRasterizer: boolean;
  /** A software rasterizer running each dispatch's workgroups on its own thread (chooseRasterizerThreads). */
  readonly inlineDispatch: boolean;
  /**
   * The device has subgroups and a lane kernel's workgroup is one of them (laneSubgroupsFit):
   * lane matmuls and the classifier load each activation vec4 once per workgroup, not once per
   * lane, and share it by subgroupBroadcast (llvmpipe loads storage lane by lane).
   */
  readonly laneSubgroups: boolean;
  /** The compiled pipeline for a WGSL program, compiled on first use. */
  pipeline(code: string, label: string): GPUComputePipeline;
}

/** Work a kernel does in one step: arithmetic, and the bytes it must move at the least. */
export interface KernelCost {
  readonly flops: number;
  readonly bytes: number;
}

/** A kernel with its buffers bound, encoded for n rows (or samples) of a step. */
export interface KernelOp {
  readonly label: string;
  encode(pass: GPUComputePassEncoder, n: number): void;
  /** Its cost for a step (for the benchmark's GFLOP/s and GB/s). */
  cost(step: StepContent): KernelCost;
}

export const NO_ADAPTER_MESSAGE =
  "no WebGPU adapter: install a GPU driver, or Mesa's Vulkan driver (apt-get install mesa-vulkan-drivers) for a CPU fallback";

/** Options for {@link acquireGpu}. */
export interface AcquireGpuOptions {
  powerPreference?: GPUPowerPreference;
  /** Caps the binding size below the adapter's (tests use it to force weight splitting). */
  maxBindingBytes?: number;
}

/**
 * Requests an adapter and a device with the adapter's real limits (binding size, buffers per
 * stage) rather than WebGPU's small defaults, and `shader-f16` / `timestamp-query` when offered.
 * Throws a message naming how to get an adapter when there is none.
 *
 * ```ts
 * const gpu = await acquireGpu();
 * console.error(`webgpu: ${gpu.description}`);
 * ```
 */
export async function acquireGpu(opts: AcquireGpuOptions = {}): Promise<Gpu> {
  if (typeof navigator === "undefined" || !("gpu" in navigator) || !navigator.gpu) {
    throw new Error(
      `Cannot start WebGPU: navigator.gpu is missing (run Deno with --unstable-webgpu); ${NO_ADAPTER_MESSAGE}`,
    );
  }
  const adapter = await requestDefaultAdapter(opts.powerPreference);
  if (!adapter) throw new Error(`Cannot start WebGPU: ${NO_ADAPTER_MESSAGE}`);
  const wanted: GPUFeatureName[] = ["shader-f16", "timestamp-query"];
  const features = wanted.filter((f) => adapter.features.has(f));
  // Deno 2.9's adapter.features leaves out "subgroups" even where the device grants it, so ask
  // where the lane kernels can use them, and ask again without if the adapter refuses.
  const subgroups = laneSubgroupsFit(adapter.info);
  const l = adapter.limits;
  const request = (required: GPUFeatureName[]) =>
    adapter.requestDevice({
      requiredFeatures: required,
      requiredLimits: {
        maxStorageBufferBindingSize: l.maxStorageBufferBindingSize,
        maxBufferSize: l.maxBufferSize,
        maxStorageBuffersPerShaderStage: l.maxStorageBuffersPerShaderStage,
        maxComputeWorkgroupStorageSize: l.maxComputeWorkgroupStorageSize,
        maxComputeInvocationsPerWorkgroup: l.maxComputeInvocationsPerWorkgroup,
        maxComputeWorkgroupSizeX: l.maxComputeWorkgroupSizeX,
        maxComputeWorkgroupsPerDimension: l.maxComputeWorkgroupsPerDimension,
      },
    });
  const device = subgroups
    ? await request([...features, "subgroups"]).catch(() => request(features))
    : await request(features);
  device.addEventListener("uncapturederror", (e) => {
    console.error(`webgpu error: ${(e as GPUUncapturedErrorEvent).error.message}`);
  });
  // Whole 4-byte words only: every kernel addresses buffers as u32/f32 arrays.
  const adapterMax = Math.min(
    device.limits.maxStorageBufferBindingSize,
    device.limits.maxBufferSize,
  );
  const maxBindingBytes = Math.floor(Math.min(adapterMax, opts.maxBindingBytes ?? Infinity) / 4) *
    4;
  const pipelines = new Map<string, GPUComputePipeline>();
  const cpuRasterizer = isCpuRasterizer(adapter.info);
  return {
    device,
    description: adapter.info.description || adapter.info.vendor || "unknown adapter",
    maxBindingBytes,
    maxStorageBuffersPerStage: device.limits.maxStorageBuffersPerShaderStage,
    maxWorkgroupsPerDimension: device.limits.maxComputeWorkgroupsPerDimension,
    hasShaderF16: features.includes("shader-f16"),
    hasTimestamps: features.includes("timestamp-query"),
    cpuRasterizer,
    inlineDispatch: cpuRasterizer && rasterizerInline(),
    laneSubgroups: device.features.has("subgroups"),
    pipeline(code: string, label: string): GPUComputePipeline {
      let p = pipelines.get(code);
      if (!p) {
        const module = device.createShaderModule({ code, label });
        p = device.createComputePipeline({
          layout: "auto",
          compute: { module, entryPoint: "main" },
          label,
        });
        pipelines.set(code, p);
      }
      return p;
    },
  };
}

/** Creates a buffer holding `data` (padded to whole words, plus `extraBytes`). */
export function uploadBuffer(
  gpu: Gpu,
  data: ArrayBufferView,
  usage: GPUBufferUsageFlags,
  label: string,
  extraBytes = 0,
): GPUBuffer {
  const size = Math.max(4, Math.ceil((data.byteLength + extraBytes) / 4) * 4);
  const buffer = gpu.device.createBuffer({ size, usage, label, mappedAtCreation: true });
  new Uint8Array(buffer.getMappedRange()).set(
    new Uint8Array(data.buffer, data.byteOffset, data.byteLength),
  );
  buffer.unmap();
  return buffer;
}

/** Binds `buffers` in order to bindings 0, 1, ... of the pipeline's group 0. */
export function bindAll(
  gpu: Gpu,
  pipeline: GPUComputePipeline,
  buffers: readonly (GPUBuffer | GPUBufferBinding)[],
  label?: string,
): GPUBindGroup {
  return gpu.device.createBindGroup({
    layout: pipeline.getBindGroupLayout(0),
    entries: buffers.map((b, binding) => ({
      binding,
      resource: b instanceof GPUBuffer ? { buffer: b } : b,
    })),
    label,
  });
}

/** Copies a buffer's first `bytes` back to the CPU (tests and the bench; never on the step path). */
export async function readBuffer(
  gpu: Gpu,
  src: GPUBuffer,
  bytes: number,
  offset = 0,
): Promise<ArrayBuffer> {
  const size = Math.ceil(bytes / 4) * 4;
  const staging = gpu.device.createBuffer({
    size,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const enc = gpu.device.createCommandEncoder();
  enc.copyBufferToBuffer(src, offset, staging, 0, size);
  gpu.device.queue.submit([enc.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const out = staging.getMappedRange().slice(0, bytes);
  staging.unmap();
  staging.destroy();
  return out;
}
