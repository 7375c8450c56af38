import { adapterBindingLimit } from "../../kernels/device.ts";
import { WebGpuEngine } from "../../kernels/webgpu_engine.ts";
import { type KvPlan, type KvRequest, planKvCache } from "../engine/kv_budget.ts";
import type { Engine, KvGeometry } from "../engine/engine.ts";
import { CpuEngine } from "../engine/cpu/cpu_engine.ts";
import type { Model } from "../model/weights.ts";
import { DEFAULT_LIMITS } from "../engine/limits.ts";

export type BackendChoice = "webgpu" | "cpu" | "auto";

/** Step limits the engine sizes its buffers for; the scheduler must stay within them. */
export interface StepLimits {
  readonly maxBatchTokens: number;
  readonly maxSeqs: number;
}

/**
 * Sizes the KV cache for this model on the backend it will run on (planKvCache): the WebGPU
 * adapter's binding limit caps each layer's pool unless the backend is the CPU, and the host's
 * free memory caps an automatic size.
 */
export async function planKv(
  model: Model,
  backend: BackendChoice,
  req: Omit<KvRequest, "maxPoolBytes" | "availableMemory">,
): Promise<KvPlan> {
  const maxPoolBytes = backend === "cpu" ? undefined : await adapterBindingLimit();
  return planKvCache(model.config, {
    ...req,
    ...(maxPoolBytes === undefined ? {} : { maxPoolBytes }),
    ...(freeMemory() === undefined ? {} : { availableMemory: freeMemory() }),
  });
}

/** Free host memory, or undefined without the permission (`--allow-sys=systemMemoryInfo`). */
function freeMemory(): number | undefined {
  try {
    return Deno.systemMemoryInfo().available;
  } catch {
    return undefined;
  }
}

/** Device (or host) memory an engine holds, for the start-up summary. */
export function engineMemory(engine: Engine): { weights: number; kvCache: number } | undefined {
  const m = (engine as { memory?: { weights: number; kvCache: number } }).memory;
  return m ? { weights: m.weights, kvCache: m.kvCache } : undefined;
}

/**
 * Creates the engine the user asked for. "auto" takes WebGPU when an adapter exists and the
 * CPU reference otherwise; the description says which and why, for the start-up line.
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
): Promise<{ engine: Engine; description: string }> {
  let fallback = "";
  if (backend !== "cpu") {
    try {
      // The engine acquires the device itself so that dispose() destroys it: the executor
      // builds a new engine after every failure, and each old device would otherwise stay alive.
      const engine = await WebGpuEngine.create(model.config, model.weights, kv, {
        maxBatchTokens: limits.maxBatchTokens,
        maxSeqs: limits.maxSeqs,
        ...(onUpload ? { onUpload } : {}),
      });
      return { engine, description: `webgpu (${engine.gpu.description})` };
    } catch (e) {
      if (backend === "webgpu") throw e;
      fallback = `; webgpu unavailable: ${e instanceof Error ? e.message : e}`;
    }
  }
  return {
    engine: new CpuEngine(model.config, model.weights, kv),
    description: `cpu (reference engine${fallback})`,
  };
}
