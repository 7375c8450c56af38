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
  /**
   * Whether the adapter offers `shader-f16`: without it the WebGPU engine's KV cache is f32,
   * twice the bytes an element, which the KV plan must count.
   */
  readonly shaderF16: boolean;
}

/** Whether an adapter is a software rasterizer (WebGPU's fallback adapter, or known by name). */
export function isCpuRasterizer(info: GPUAdapterInfo): boolean {
  const i = info as GPUAdapterInfo & { isFallbackAdapter?: boolean };
  return i.isFallbackAdapter === true ||
    /llvmpipe|lavapipe|swiftshader|microsoft basic render/i.test(
      `${i.description} ${i.device} ${i.architecture}`,
    );
}

/** Threads of a lane kernel's workgroup (matmulLaneWgsl, classifierLaneWgsl): one SIMD batch of llvmpipe. */
export const LANE_THREADS = 8;

/**
 * Whether a lane kernel's workgroup is exactly one subgroup on this adapter, so its lanes can
 * load one activation vec4 each and share them by subgroupBroadcast instead of every lane
 * loading every vec4: a CPU rasterizer whose subgroups are always LANE_THREADS wide (lavapipe
 * on 256-bit vectors says 8..8; llvmpipe through OpenGL ES says 4..128 and has no subgroups).
 */
export function laneSubgroupsFit(info: GPUAdapterInfo): boolean {
  const i = info as GPUAdapterInfo & { subgroupMinSize?: number; subgroupMaxSize?: number };
  return isCpuRasterizer(info) && i.subgroupMinSize === LANE_THREADS &&
    i.subgroupMaxSize === LANE_THREADS;
}

/**
 * Mesa's variable for the threads its software rasterizers (llvmpipe, lavapipe) run a
 * dispatch's workgroups on; 0 runs them on the driver's own thread. Mesa reads it once, when
 * the process first asks for an adapter.
 */
export const RASTERIZER_THREADS_ENV = "LP_NUM_THREADS";

/** LP_NUM_THREADS as it was when this process first asked for an adapter (null: not yet). */
let threadsAtLoad: string | undefined | null = null;

/** The default adapter; every request in this process goes through here (see threadsAtLoad). */
export async function requestDefaultAdapter(
  powerPreference: GPUPowerPreference = "high-performance",
): Promise<GPUAdapter | null> {
  const first = threadsAtLoad === null;
  if (first) threadsAtLoad = readEnv(RASTERIZER_THREADS_ENV);
  const adapter = await navigator.gpu.requestAdapter({ powerPreference });
  // Mesa has read it now: processes this one starts get the user's environment, not ours.
  if (first) setHere?.delete(RASTERIZER_THREADS_ENV);
  setHere = undefined;
  return adapter;
}

/** The environment chooseRasterizerThreads set LP_NUM_THREADS in, until the adapter is loaded. */
let setHere: Pick<typeof Deno.env, "delete"> | undefined;

/** A variable's value, or undefined where this process may not read it (the adapter probe runs with no permissions). */
function readEnv(name: string): string | undefined {
  try {
    return Deno.env.get(name);
  } catch (e) {
    if (e instanceof Deno.errors.NotCapable || e instanceof Deno.errors.PermissionDenied) {
      return undefined;
    }
    throw e;
  }
}

/** Whether a software rasterizer loaded in this process runs workgroups inline (LP_NUM_THREADS=0). */
export function rasterizerInline(): boolean {
  return threadsAtLoad === "0";
}

/**
 * Per-step matrix bytes at or below which a model runs its workgroups inline on a software
 * rasterizer. By default Mesa hands every dispatch to a pool of one thread per core, and on
 * 2 cores that handoff costs some 60 us a dispatch, more than a tiny model's kernels take:
 * stories260K (1 MiB, 23 dispatches a step) spent 2.1 ms of GPU time a step pooled and
 * 0.65 ms inline, and decoded 459 -> 848 tokens/s. From a few MiB up the second core pays:
 * tinyllama-like (13 MB) 74 tokens/s pooled against 69 inline, 293 against 218 at 8
 * sequences, and the Qwen2.5-0.5B shape 3.1 against 2.2.
 */
export const INLINE_RASTERIZER_BYTES = 4 * 2 ** 20;

/**
 * Before this process's first adapter, lets a model whose matrices read at most
 * INLINE_RASTERIZER_BYTES a step run a software rasterizer's workgroups inline, by setting
 * LP_NUM_THREADS=0 (only Mesa's software drivers read it). Leaves the variable alone when the
 * user set it, and does nothing once an adapter was requested (Mesa has read it then); the
 * first model to ask decides for the whole process. The variable is removed again once the
 * adapter is loaded, so child processes (servers, probes) choose for themselves. Returns what
 * the driver will do, or "fixed" when it was already loaded.
 */
export function chooseRasterizerThreads(
  matrixBytes: number,
  env: Pick<typeof Deno.env, "get" | "set" | "delete"> = Deno.env,
): "inline" | "pool" | "fixed" {
  if (threadsAtLoad !== null) return "fixed";
  const set = env.get(RASTERIZER_THREADS_ENV);
  if (set !== undefined) return set === "0" ? "inline" : "pool";
  if (matrixBytes > INLINE_RASTERIZER_BYTES) return "pool";
  env.set(RASTERIZER_THREADS_ENV, "0");
  setHere = env;
  return "inline";
}

/** Describes the default adapter in this process; undefined when there is none. */
export async function describeAdapter(): Promise<AdapterSummary | undefined> {
  if (typeof navigator === "undefined" || !navigator.gpu) return undefined;
  const adapter = await requestDefaultAdapter();
  if (!adapter) return undefined;
  const l = adapter.limits;
  return {
    description: adapter.info.description || adapter.info.vendor || "unknown adapter",
    cpuRasterizer: isCpuRasterizer(adapter.info),
    bindingLimit: Math.floor(Math.min(l.maxStorageBufferBindingSize, l.maxBufferSize) / 4) * 4,
    shaderF16: adapter.features.has("shader-f16"),
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
    !(typeof s.bindingLimit === "number" && s.bindingLimit > 0) ||
    typeof s.shaderF16 !== "boolean"
  ) {
    throw new Error(
      `the adapter probe printed ${JSON.stringify(last.slice(0, 200))}, not an adapter`,
    );
  }
  return {
    description: s.description,
    cpuRasterizer: s.cpuRasterizer,
    bindingLimit: s.bindingLimit,
    shaderF16: s.shaderF16,
  };
}

if (import.meta.main) console.log(JSON.stringify((await describeAdapter()) ?? null));
