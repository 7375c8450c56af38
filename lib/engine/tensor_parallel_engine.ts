import type { Engine, KvGeometry, StepPlan, StepResult } from "./engine.ts";
import type { ModelConfig } from "../model/model_config.ts";
import { resolveTokens } from "./pipeline_engine.ts";
import type { StageLink } from "./stage_link.ts";

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
  readonly #last = new Map<number, Promise<number>>();
  #entry: Promise<unknown> = Promise.resolve();

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
  }

  step(plan: StepPlan): Promise<StepResult> {
    const from = new Map(plan.seqs.map((s) => [s.seqId, this.#last.get(s.seqId)]));
    const entered = this.#entry
      .then(() => resolveTokens(plan, from))
      .then((p) =>
        this.ranks.map((r) =>
          r.stepStage(p).catch((e) => {
            this.onRankFailed?.(e instanceof Error ? e : new Error(String(e)));
            throw e;
          })
        )
      );
    this.#entry = entered.catch(() => {});
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
    for (const seq of plan.seqs) {
      if (!seq.sample) continue;
      const token = result.then((r) => r.sampled.find((s) => s.seqId === seq.seqId)!.token);
      token.catch(() => {});
      this.#last.set(seq.seqId, token);
    }
    return result;
  }

  release(seqId: number): void {
    this.#entry = this.#entry.then(() => {
      const last = this.#last.get(seqId) ?? Promise.resolve();
      this.#last.delete(seqId);
      last.finally(() => this.ranks.forEach((r) => r.release?.(seqId))).catch(() => {});
    });
  }

  dispose(): void {
    for (const r of this.ranks) r.dispose();
    this.#last.clear();
  }
}
