import type { Engine, StepPlan, StepResult } from "./engine.ts";

/**
 * Test-only fault injection for the real server, so reliability tests can break a running
 * executor from outside the process. Off unless LLMSERVE_FAULT_STEPS is set, e.g.
 *
 *   LLMSERVE_FAULT_STEPS="20,45:device-lost"
 *
 * fails the 20th and the 45th engine step (counted from 1 across engine restarts). A fault is
 * one of:
 * - `crash` (the default): the step computes its first half of sequences (their KV is written,
 *   their tokens sampled) and then throws, like an executor killed in the middle of a step;
 * - `device-lost`: the step rejects and so does every later call on that engine, like a
 *   WebGPU device that is gone, until the supervisor replaces the engine.
 * Either way the executor's supervisor must restart the engine and the scheduler recompute
 * what was in flight.
 */

export type FaultKind = "crash" | "device-lost";

export const FAULT_ENV = "LLMSERVE_FAULT_STEPS";

/** Parses "12,40:device-lost" into step number -> kind; the error says which entry is wrong. */
export function parseFaultSteps(spec: string): Map<number, FaultKind> {
  const out = new Map<number, FaultKind>();
  for (const entry of spec.split(",").map((s) => s.trim()).filter(Boolean)) {
    const [step, kind = "crash"] = entry.split(":");
    const n = Number(step);
    if (!Number.isInteger(n) || n < 1 || (kind !== "crash" && kind !== "device-lost")) {
      throw new Error(
        `Invalid ${FAULT_ENV}: expected step numbers >= 1, each optionally ":crash" or ":device-lost", separated by commas; received entry ${
          JSON.stringify(entry)
        } in ${JSON.stringify(spec)}`,
      );
    }
    out.set(n, kind);
  }
  return out;
}

/** Counts steps over every engine it wraps and fails the chosen ones. */
export class FaultInjector {
  /** Engine steps started so far, over all wrapped engines. */
  steps = 0;
  /** Faults injected so far. */
  injected = 0;

  constructor(readonly plan: ReadonlyMap<number, FaultKind>) {}

  /** The injector LLMSERVE_FAULT_STEPS asks for, or undefined when it is unset or empty. */
  static fromEnv(
    get: (name: string) => string | undefined = (n) => Deno.env.get(n),
  ): FaultInjector | undefined {
    const spec = get(FAULT_ENV);
    if (spec === undefined || spec.trim() === "") return undefined;
    return new FaultInjector(parseFaultSteps(spec));
  }

  /** `engine` with faults injected at the planned step numbers. */
  wrap(engine: Engine): Engine {
    let lost: string | undefined;
    return {
      name: engine.name,
      config: engine.config,
      kv: engine.kv,
      // The step buffers of the wrapped engine are still what bounds a plan, and its
      // capabilities still decide the core's pipeline depth and late masks.
      ...(engine.limits === undefined ? {} : { limits: engine.limits }),
      ...(engine.lateMasks === undefined ? {} : { lateMasks: engine.lateMasks }),
      ...(engine.resultsOnHost === undefined ? {} : { resultsOnHost: engine.resultsOnHost }),
      ...(engine.readbackLatencyMs === undefined
        ? {}
        : { readbackLatencyMs: engine.readbackLatencyMs }),
      release: (seqId) => engine.release?.(seqId),
      dispose: () => engine.dispose(),
      step: (plan: StepPlan): Promise<StepResult> => {
        const n = ++this.steps;
        if (lost !== undefined) return Promise.reject(new Error(lost));
        const kind = this.plan.get(n);
        if (kind === undefined) return engine.step(plan);
        this.injected++;
        if (kind === "device-lost") {
          lost = `injected fault: the device was lost at engine step ${n} (plan ${plan.stepId})`;
          return Promise.reject(new Error(lost));
        }
        const half = Math.ceil(plan.seqs.length / 2);
        return engine.step({ ...plan, seqs: plan.seqs.slice(0, half) }).then(() => {
          throw new Error(
            `injected fault: the executor was killed in the middle of engine step ${n} (plan ${plan.stepId}, after ${half} of ${plan.seqs.length} sequences)`,
          );
        });
      },
    };
  }
}
