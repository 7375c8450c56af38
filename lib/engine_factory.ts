import type { Engine, KvGeometry } from "./engine.ts";
import { CpuEngine } from "./reference/cpu_engine.ts";
import type { Model } from "./weights.ts";

export type BackendChoice = "webgpu" | "cpu" | "auto";

/**
 * Creates the engine the user asked for. "auto" takes WebGPU when an adapter exists and the
 * CPU reference otherwise; the description says which, for the start-up line.
 */
export async function createEngine(
  model: Model,
  backend: BackendChoice,
  kv: KvGeometry,
): Promise<{ engine: Engine; description: string }> {
  if (backend !== "cpu") {
    const gpu = await tryWebGpu(model, kv, backend === "webgpu");
    if (gpu) return gpu;
  }
  return { engine: new CpuEngine(model.config, model.weights, kv), description: "cpu (reference engine)" };
}

async function tryWebGpu(
  _model: Model,
  _kv: KvGeometry,
  required: boolean,
): Promise<{ engine: Engine; description: string } | undefined> {
  if (required) throw new Error("Cannot start the webgpu backend: not built yet");
  return undefined;
}
