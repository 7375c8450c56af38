import type { Engine, KvGeometry, StepPlan, StepResult } from "./engine.ts";
import type { ModelConfig } from "../model/model_config.ts";
import type { StageLink } from "./stage_link.ts";
import { StepOrder } from "./step_order.ts";

/**
 * The Engine the executor drives when every layer's matmuls are split over tensor-parallel
 * ranks (kernels/wasm/tp_shard.ts): each step goes to every rank at once, the ranks gather
 * each other's columns while they run, and rank 0 (the first of `ranks`) samples. Steps enter
 * every rank in call order, so the ranks' gathers pair up; a decode from the token sampled
 * last waits for the step that sampled it and is sent as a plain token.
 */
export class TensorParallelEngine implements Engine {
  readonly name = "tensor-parallel";
  readonly resultsOnHost = true;
  readonly hiddenStates = true;
  readonly #order: StepOrder;

  constructor(
    readonly config: ModelConfig,
    readonly kv: KvGeometry,
    readonly ranks: readonly StageLink[],
    readonly limits?: { readonly maxSeqs: number; readonly maxBatchTokens: number },
    /**
     * Called when a rank fails a step: the other ranks may be waiting at a gather for its
     * columns, so the caller fails their gathers (tp_link.ts's HubGather.fail).
     */
    readonly onRankFailed?: (e: Error) => void,
  ) {
    const whole = ranks.every((r) => r.stage.start === 0 && r.stage.end === config.nLayers);
    if (ranks.length === 0 || !whole) {
      throw new Error(
        `Cannot group tensor-parallel ranks: expected at least one, each running all ` +
          `${config.nLayers} layers, received ${
            ranks.map((r) => `${r.stage.start}-${r.stage.end}`).join(", ") || "none"
          }`,
      );
    }
    this.#order = new StepOrder(ranks);
  }

  step(plan: StepPlan): Promise<StepResult> {
    const entered = this.#order.enter(
      plan,
      (p) =>
        this.ranks.map((r) =>
          r.stepStage(p).catch((e) => {
            this.onRankFailed?.(e instanceof Error ? e : new Error(String(e)));
            throw e;
          })
        ),
    );
    const result = entered.then(async (outs) => {
      const [first, ...rest] = await Promise.all(outs);
      if (first!.kind !== "result" || rest.some((o) => o.kind !== "rows")) {
        throw new Error(
          `Invalid answers to step ${plan.stepId} from the tensor-parallel ranks: expected ` +
            `the result from rank 0 and rows from the others, received ${
              [first!, ...rest].map((o) => o.kind).join(", ")
            }`,
        );
      }
      return first!.result;
    });
    return this.#order.sampling(plan, result);
  }

  release(seqId: number): void {
    this.#order.release(seqId);
  }

  dispose(): void {
    this.#order.dispose();
  }
}
