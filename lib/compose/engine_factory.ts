import { NO_ADAPTER_MESSAGE } from "../../kernels/webgpu/device.ts";
import {
  type AdapterSummary,
  chooseRasterizerThreads,
  describeAdapter,
  describeAdapterInChild,
} from "../../kernels/webgpu/adapter.ts";
import { WebGpuEngine } from "../../kernels/webgpu/webgpu_engine.ts";
import { WasmEngine } from "../../kernels/wasm/wasm_engine.ts";
import { wasmHeap } from "../../kernels/wasm/heap.ts";
import {
  CPU_HEADROOM,
  heldLayers,
  kvBlocksBeside,
  placeInHeaps,
} from "../../kernels/wasm/tensor_placement.ts";
import {
  availableMemory,
  kvBlockBytes,
  type KvPlan,
  type KvRequest,
  planKvCache,
} from "../engine/kv_budget.ts";
import type { PlaceTensors } from "../model/gguf.ts";
import { type Engine, GREEDY, type KvGeometry } from "../engine/engine.ts";
import { CpuEngine } from "../../kernels/reference/cpu_engine.ts";
import { type Model, stepMatrixBytes } from "../model/weights.ts";
import { DEFAULT_LIMITS } from "../engine/limits.ts";

export { type BackendChoice, BACKENDS } from "../engine/backend_choice.ts";
import type { BackendChoice } from "../engine/backend_choice.ts";

/** Step limits the engine sizes its buffers for; the scheduler must stay within them. */
export interface StepLimits {
  readonly maxBatchTokens: number;
  readonly maxSeqs: number;
}

/** Settings of the CPU engine. */
export interface EngineOptions {
  /** CPU engine threads; default: the machine's cores. */
  readonly threads?: number;
  /** KV cache elements of the CPU engine (WebGPU's are f32). */
  readonly kvDtype?: "f16" | "f32";
}

/** The backend to build, once "auto" has looked at the adapter. */
export interface ResolvedBackend {
  /** What to plan the KV cache for and build: "auto" only when there is a real GPU to time. */
  readonly backend: BackendChoice;
  /** Why "auto" chose without timing, for the start-up line. */
  readonly note?: string;
  /** The adapter "auto" found, so the KV planner need not ask again. */
  readonly adapter?: AdapterSummary;
}

/**
 * Settles "auto" where no timing is needed: with no adapter, or with a software rasterizer
 * (llvmpipe, SwiftShader, WARP), which runs the WebGPU kernels on the same cores as the CPU
 * engine and measured 20 to 30 times slower than it here, it is the CPU engine. The adapter
 * is asked in a child process (kernels/webgpu/adapter.ts), so that choosing the CPU engine leaves no
 * graphics driver in this process's memory. Other choices pass through.
 */
export async function resolveBackend(asked: BackendChoice): Promise<ResolvedBackend> {
  if (asked !== "auto") return { backend: asked };
  let adapter: AdapterSummary | undefined;
  try {
    adapter = await describeAdapterInChild();
  } catch (e) {
    return {
      backend: "cpu",
      note: `auto chose it: webgpu unavailable: ${e instanceof Error ? e.message : e}`,
    };
  }
  if (adapter === undefined) {
    return { backend: "cpu", note: `auto chose it: webgpu unavailable: ${NO_ADAPTER_MESSAGE}` };
  }
  if (adapter.cpuRasterizer) {
    return {
      backend: "cpu",
      note: `auto chose it without timing webgpu: its adapter, ${adapter.description}, is a ` +
        `software rasterizer on these same cores (--backend webgpu uses it anyway)`,
      adapter,
    };
  }
  return { backend: "auto", adapter };
}

/** An engine's description with the reason "auto" chose it, when there is one. */
export function describeChoice(description: string, resolved: ResolvedBackend): string {
  return resolved.note === undefined ? description : `${description}; ${resolved.note}`;
}

/**
 * Where a model's bytes should be read to for this backend: the CPU engine's shared memory
 * (so its threads read the file's bytes in place) when the CPU engine may run it and the file
 * fits in one WebAssembly memory with room for a KV cache; ordinary memory otherwise (a GGUF
 * too big for one memory is placed tensor by tensor instead: modelPlacement).
 */
export function modelAllocator(
  backend: BackendChoice,
): ((bytes: number) => Uint8Array) | undefined {
  if (backend !== "cpu" && backend !== "auto") return undefined;
  return (bytes) =>
    bytes + CPU_HEADROOM <= wasmHeap().room
      ? wasmHeap().bytes(bytes, "the model's weights")
      : new Uint8Array(bytes);
}

/**
 * For the CPU engine, a GGUF too big for one WebAssembly memory is read tensor by tensor
 * straight into several, by layer range, with room for a KV cache of `kvMemory` (automatic
 * when undefined; kernels/wasm/tensor_placement.ts).
 */
export function modelPlacement(
  backend: BackendChoice,
  kvMemory?: number,
): PlaceTensors | undefined {
  if (backend !== "cpu" && backend !== "auto") return undefined;
  return (tensors) => placeInHeaps(tensors, kvMemory === undefined ? {} : { kvBytes: kvMemory });
}

/**
 * Sizes the KV cache for this model on the backend it will run on (planKvCache): the WebGPU
 * adapter's binding limit caps each layer's pool unless the backend runs on the CPU, the CPU
 * engine's f16 cache takes 2 bytes an element and each memory's layers' share of it must fit
 * beside them in that memory's 4 GiB, and the host's free memory caps an automatic size.
 */
export async function planKv(
  model: Model,
  backend: BackendChoice,
  req: Omit<KvRequest, "maxPoolBytes" | "availableMemory">,
  opts: EngineOptions = {},
  adapter?: AdapterSummary,
): Promise<KvPlan> {
  const onCpu = backend === "cpu" || backend === "reference";
  // Before this process's first adapter (describeAdapter asks for one): Mesa reads it then.
  if (!onCpu) chooseRasterizerThreads(stepMatrixBytes(model.weights));
  const summary = onCpu ? undefined : adapter ?? await describeAdapter();
  const maxPoolBytes = summary?.bindingLimit;
  // The plan counts elements at the size of the engine it is for: the reference engine's are
  // f32, the cpu engine's f16 unless told f32, and the webgpu engine's f16 only where the
  // adapter has shader-f16 (else it stores f32, and a plan at 2 bytes would double the cap).
  const cpuElement = opts.kvDtype === "f32" ? 4 : 2;
  const gpuElement = opts.kvDtype === "f32" || summary?.shaderF16 === false ? 4 : 2;
  // auto may pick either engine: the plan must hold for the larger element.
  const bytesPerElement = backend === "reference"
    ? 4
    : backend === "cpu"
    ? cpuElement
    : backend === "webgpu"
    ? gpuElement
    : Math.max(cpuElement, summary === undefined ? cpuElement : gpuElement);
  const runsCpu = backend === "cpu" || backend === "auto";
  const memories = heldLayers(model.weights) ??
    [{ heap: wasmHeap(), layers: model.config.nLayers }];
  // One block's K and V for one layer, at the CPU engine's element size.
  const layerBlockBytes = 2 * req.blockSize * model.config.nKvHeads * model.config.headDim *
    cpuElement;
  const cpuBlocks = kvBlocksBeside(
    memories.map((m) => ({ room: m.heap.room, layers: m.layers })),
    layerBlockBytes,
  );
  const available = availableMemory();
  return planKvCache(model.config, {
    ...req,
    bytesPerElement,
    ...(runsCpu
      ? {
        maxBytes: cpuBlocks * kvBlockBytes(model.config, req.blockSize, bytesPerElement),
        memories: memories.length,
      }
      : {}),
    ...(maxPoolBytes === undefined ? {} : { maxPoolBytes }),
    ...(available === undefined ? {} : { availableMemory: available }),
  });
}

/** Device (or host) memory an engine holds, for the start-up summary. */
export function engineMemory(
  engine: Engine,
):
  | { readonly weights: number; readonly kvCache: number; readonly kvResident?: number }
  | undefined {
  // The engine's own object: its kvResident is a live getter, so later reads see the growth.
  return (engine as { memory?: { weights: number; kvCache: number; kvResident?: number } }).memory;
}

/**
 * Milliseconds of one decode step of one sequence (the best of three after a warm-up), on KV
 * block 0. Used only before the engine serves anything: block 0 is overwritten when first
 * allocated.
 */
export async function timeDecodeStep(engine: Engine): Promise<number> {
  const seqId = -1;
  const plan = (stepId: number, pos: number) => ({
    stepId,
    seqs: [{ seqId, tokens: [1], startPos: pos, blockTable: [0], sample: true, sampling: GREEDY }],
  });
  await engine.step(plan(-1, 0));
  let best = Infinity;
  for (let i = 0; i < 3; i++) {
    const t0 = performance.now();
    await engine.step(plan(-2 - i, 1 + i));
    best = Math.min(best, performance.now() - t0);
  }
  engine.release?.(seqId);
  return best;
}

/**
 * Creates the engine the user asked for: "cpu" (the WebAssembly engine), "webgpu",
 * "reference" (the plain TypeScript oracle), or "auto", which builds the CPU engine and, when
 * an adapter exists, the WebGPU one, times a decode step on each and keeps the faster. The
 * description says which and why, for the start-up line.
 */
export async function createEngine(
  model: Model,
  backend: BackendChoice,
  kv: KvGeometry,
  limits: StepLimits = {
    maxBatchTokens: DEFAULT_LIMITS.maxBatchTokens,
    maxSeqs: DEFAULT_LIMITS.maxRunning,
  },
  onUpload?: (bytes: number, total: number) => void,
  opts: EngineOptions = {},
): Promise<{ engine: Engine; description: string }> {
  const cpu = async () => {
    const e = await WasmEngine.create(model.config, model.weights, kv, {
      maxBatchTokens: limits.maxBatchTokens,
      maxSeqs: limits.maxSeqs,
      ...(opts.threads === undefined ? {} : { threads: opts.threads }),
      ...(opts.kvDtype === undefined ? {} : { kvDtype: opts.kvDtype }),
    });
    return {
      engine: e,
      description: `cpu (WebAssembly ${
        e.flavour === "relaxed" ? "relaxed SIMD" : "SIMD"
      }, ${e.threads} threads, ${e.kvDtype} KV)`,
    };
  };
  const gpu = async (geometry = kv, stepLimits = limits) => {
    // The engine acquires the device itself so that dispose() destroys it: the executor
    // builds a new engine after every failure, and each old device would otherwise stay alive.
    const e = await WebGpuEngine.create(model.config, model.weights, geometry, {
      maxBatchTokens: stepLimits.maxBatchTokens,
      maxSeqs: stepLimits.maxSeqs,
      ...(onUpload ? { onUpload } : {}),
      ...(opts.kvDtype === undefined ? {} : { kvDtype: opts.kvDtype }),
    });
    return {
      engine: e as Engine,
      description: `webgpu (${e.gpu.description}${
        e.gpu.inlineDispatch ? ", dispatches inline" : ""
      }${e.gpu.laneSubgroups ? ", 8-lane subgroups" : ""}, ${e.kvDtype} KV)`,
    };
  };
  if (backend === "reference") {
    return {
      engine: new CpuEngine(model.config, model.weights, kv),
      description: "reference (plain TypeScript, f32 weights)",
    };
  }
  if (backend === "cpu") return await cpu();
  if (backend === "webgpu") return await gpu();
  // auto: the WebGPU side is timed on an engine with one KV block and one row, so that losing
  // costs no device-sized KV cache; it is built in full only when it wins.
  const c = await cpu();
  let g: { engine: Engine; description: string };
  try {
    g = await gpu({ numBlocks: 1, blockSize: kv.blockSize }, { maxBatchTokens: 1, maxSeqs: 1 });
  } catch (e) {
    return {
      ...c,
      description: `${c.description}; webgpu unavailable: ${e instanceof Error ? e.message : e}`,
    };
  }
  const [cpuMs, gpuMs] = [await timeDecodeStep(c.engine), await timeDecodeStep(g.engine)];
  const timings = `decode step ${cpuMs.toFixed(1)} ms on cpu, ${
    gpuMs.toFixed(1)
  } ms on ${g.description}`;
  g.engine.dispose();
  if (cpuMs <= gpuMs) {
    return { engine: c.engine, description: `${c.description}; auto chose it: ${timings}` };
  }
  c.engine.dispose();
  const full = await gpu();
  return { engine: full.engine, description: `${full.description}; auto chose it: ${timings}` };
}

/**
 * The backend an executor restart rebuilds: the one "auto" chose at start-up (its description
 * starts with the engine's name), so a restart neither re-times both nor switches engines.
 */
export function rebuildBackend(description: string, asked: BackendChoice): BackendChoice {
  if (asked !== "auto") return asked;
  return description.startsWith("webgpu") ? "webgpu" : "cpu";
}

/**
 * One throw-away step before the server says it is ready: WebGPU compiles its pipelines on
 * first use (about a second on llvmpipe), which would otherwise land on the first request's
 * time to first token. It writes block 0's first slot, which the next owner overwrites.
 */
export async function warmUp(engine: Engine, bosId: number): Promise<void> {
  const seqId = -1;
  await engine.step({
    stepId: -1,
    seqs: [{
      seqId,
      tokens: [bosId],
      startPos: 0,
      blockTable: [0],
      sample: true,
      sampling: GREEDY,
    }],
  });
  engine.release?.(seqId);
}
