/**
 * What the default WebGPU adapter is, without keeping its driver in this process.
 *
 * Requesting an adapter loads the Vulkan or GL driver into the process for good: about 75 MB
 * of RSS for Mesa's llvmpipe, and some 280 MB more once a device has compiled the engine's
 * pipelines, none of it returned by destroying the device. `--backend auto` only needs to know
 * whether the adapter is a real GPU before it builds anything, so it asks a child process
 * (this file run as a program, which imports nothing) and reads one line of JSON.
 */

/** The adapter as `auto` and the KV planner see it. */
export interface AdapterSummary {
  /** E.g. "llvmpipe (LLVM 15.0.6, 256 bits)". */
  readonly description: string;
  /**
   * A software rasterizer on the CPU (Mesa llvmpipe/lavapipe, SwiftShader, WARP): it runs on
   * the same cores as the CPU engine.
   */
  readonly cpuRasterizer: boolean;
  /** The largest buffer one binding may cover, in whole 4-byte words. */
  readonly bindingLimit: number;
}

/** Whether an adapter is a software rasterizer (WebGPU's fallback adapter, or known by name). */
export function isCpuRasterizer(info: GPUAdapterInfo): boolean {
  const i = info as GPUAdapterInfo & { isFallbackAdapter?: boolean };
  return i.isFallbackAdapter === true ||
    /llvmpipe|lavapipe|swiftshader|microsoft basic render/i.test(
      `${i.description} ${i.device} ${i.architecture}`,
    );
}

/** Describes the default adapter in this process; undefined when there is none. */
export async function describeAdapter(): Promise<AdapterSummary | undefined> {
  if (typeof navigator === "undefined" || !navigator.gpu) return undefined;
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter) return undefined;
  const l = adapter.limits;
  return {
    description: adapter.info.description || adapter.info.vendor || "unknown adapter",
    cpuRasterizer: isCpuRasterizer(adapter.info),
    bindingLimit: Math.floor(Math.min(l.maxStorageBufferBindingSize, l.maxBufferSize) / 4) * 4,
  };
}

/**
 * Describes the default adapter from a child Deno process (same binary, same environment, so
 * the same driver and `DENO_WEBGPU_BACKEND`), leaving this process free of the driver.
 * Undefined when there is no adapter; throws when the child cannot run or answers nonsense.
 * Needs `--allow-run` for `Deno.execPath()`.
 */
export async function describeAdapterInChild(): Promise<AdapterSummary | undefined> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--no-prompt", "--no-config", "--quiet", new URL(import.meta.url).href],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout).trim();
  if (!out.success) {
    const err = new TextDecoder().decode(out.stderr).trim().split("\n").slice(-3).join(" ");
    throw new Error(`the adapter probe exited with code ${out.code}: ${err || "no output"}`);
  }
  const last = text.split("\n").at(-1) ?? "";
  let parsed: unknown;
  try {
    parsed = JSON.parse(last);
  } catch {
    throw new Error(`the adapter probe printed ${JSON.stringify(last.slice(0, 200))}, not JSON`);
  }
  if (parsed === null) return undefined;
  const s = parsed as Partial<AdapterSummary>;
  if (
    typeof s.description !== "string" || typeof s.cpuRasterizer !== "boolean" ||
    !(typeof s.bindingLimit === "number" && s.bindingLimit > 0)
  ) {
    throw new Error(`the adapter probe printed ${JSON.stringify(last.slice(0, 200))}, not an adapter`);
  }
  return { description: s.description, cpuRasterizer: s.cpuRasterizer, bindingLimit: s.bindingLimit };
}

if (import.meta.main) console.log(JSON.stringify((await describeAdapter()) ?? null));
