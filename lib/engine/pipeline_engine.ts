import type { Engine, KvGeometry, StepPlan, StepResult } from "./engine.ts";
import type { ModelConfig } from "../model/model_config.ts";
import type { StageLink, StageOutput } from "./stage_link.ts";
import { StepOrder } from "./step_order.ts";

/**
 * Refuses stages that do not chain layers 0..nLayers in order without gap or overlap, naming
 * the first stage out of place and what it runs.
 */
export function checkChain(stages: readonly StageLink[], nLayers: number): void {
  let next = 0;
  stages.forEach((s, i) => {
    if (s.stage.start !== next || s.stage.end <= s.stage.start) {
      throw new Error(
        `Cannot chain pipeline stages: stage ${i} runs layers ${s.stage.start}-${s.stage.end}, ` +
          `expected layers from ${next} on`,
      );
    }
    next = s.stage.end;
  });
  if (next !== nLayers) {
    throw new Error(
      `Cannot chain pipeline stages: they run layers 0-${next}, the model has ${nLayers}`,
    );
  }
}

/** One stage's part of one step (a micro-batch), as the head saw it. */
export interface StageStep {
  readonly stage: number;
  /** The micro-batch's plan. */
  readonly plan: StepPlan;
  /** performance.now() when it was sent. */
  readonly startedAt: number;
  /** From sending to the answer, queueing behind earlier micro-batches included. */
  readonly ms: number;
  /** Bytes of activation rows sent with it. */
  readonly bytes: number;
  /** Why the stage failed it, if it did. */
  readonly error?: unknown;
}

/** What watches the stages' work (pipeline_head.ts: Prometheus series and trace spans). */
export interface StageObserver {
  sent(stage: number): void;
  answered(step: StageStep): void;
}

/**
 * The Engine the executor drives when a model's layers are split over pipeline stages
 * (StageLink: in this process or another). Each step goes down the chain: the first stage
 * embeds, each passes its residual rows (f32, so the output is bit-identical to one process)
 * to the next, and the last samples. Steps enter each stage in call order, so a step may be
 * called before the last one ended; a decode from the token sampled last waits only for the
 * step that sampled it, which the head sends as a plain token.
 */
export class PipelineEngine implements Engine {
  readonly name = "pipeline";
  readonly resultsOnHost = true;
  readonly hiddenStates = true;
  readonly #order: StepOrder;
  /** Told of each stage's part of each step (a micro-batch's), when it is sent and answered. */
  onStage?: StageObserver;

  constructor(
    readonly config: ModelConfig,
    readonly kv: KvGeometry,
    readonly stages: readonly StageLink[],
    readonly limits?: { readonly maxSeqs: number; readonly maxBatchTokens: number },
    /**
     * Groups a step's sequences are split into, each going down the chain on its own (1: the
     * whole step at once). With as many groups as stages, and the next step called before this
     * one ended (the scheduler's pipelining), all stages work at once: a group's next step
     * enters the first stage as soon as its tokens are sampled, while the other groups are
     * still in the later stages.
     */
    readonly microBatches = 1,
  ) {
    checkChain(stages, config.nLayers);
    this.#order = new StepOrder(stages);
    if (!Number.isInteger(microBatches) || microBatches < 1) {
      throw new Error(`Invalid micro-batch count ${microBatches}: expected a positive integer`);
    }
  }

  step(plan: StepPlan): Promise<StepResult> {
    const groups = splitEvenly(plan.seqs, this.microBatches);
    if (groups.length === 1) return this.#stepGroup(plan);
    // The block copies come first, with the first group, at every stage.
    const { kvCopies: _, ...rest } = plan;
    const parts = groups.map((seqs, g) =>
      this.#stepGroup(g === 0 ? { ...plan, seqs } : { ...rest, seqs })
    );
    return Promise.all(parts).then((rs) => {
      const hidden = rs.flatMap((r) => r.hidden ?? []);
      return {
        stepId: plan.stepId,
        sampled: rs.flatMap((r) => r.sampled),
        ...(hidden.length > 0 ? { hidden } : {}),
      };
    });
  }

  /** One group's step down the chain; its sequences' tokens are known when it ends. */
  #stepGroup(plan: StepPlan): Promise<StepResult> {
    const entered = this.#order.enter(plan, (p) => ({ plan: p, out: this.#timed(0, p) }));
    return this.#order.sampling(plan, entered.then(({ plan: p, out }) => this.#through(p, out)));
  }

  /** The step's rows through stages 1.. in order; the last stage's result. */
  #timed(s: number, plan: StepPlan, rows?: Float32Array): Promise<StageOutput> {
    const observer = this.onStage;
    if (!observer) return this.stages[s]!.stepStage(plan, rows);
    const startedAt = performance.now();
    observer.sent(s);
    const out = this.stages[s]!.stepStage(plan, rows);
    const bytes = rows?.byteLength ?? 0;
    const done = (error?: unknown) =>
      observer.answered({
        stage: s,
        plan,
        startedAt,
        ms: performance.now() - startedAt,
        bytes,
        error,
      });
    out.then(() => done(), (e) => done(e));
    return out;
  }

  async #through(plan: StepPlan, first: Promise<StageOutput>): Promise<StepResult> {
    let out = await first;
    for (let s = 1; s < this.stages.length; s++) {
      if (out.kind !== "rows") throw unexpected(plan, s - 1, "a result", "its rows");
      out = await this.#timed(s, plan, out.rows);
    }
    if (out.kind !== "result") {
      throw unexpected(plan, this.stages.length - 1, "rows", "the step's result");
    }
    return out.result;
  }

  release(seqId: number): void {
    this.#order.release(seqId);
  }

  dispose(): void {
    this.#order.dispose();
  }
}

/** `items` in at most `n` contiguous groups of sizes differing by at most one (one group when empty). */
export function splitEvenly<T>(items: readonly T[], n: number): T[][] {
  const k = Math.max(1, Math.min(n, items.length));
  const groups: T[][] = [];
  let at = 0;
  for (let g = 0; g < k; g++) {
    const size = Math.floor(items.length / k) + (g < items.length % k ? 1 : 0);
    groups.push(items.slice(at, at += size));
  }
  return groups;
}

function unexpected(plan: StepPlan, stage: number, got: string, want: string): Error {
  return new Error(
    `Pipeline step ${plan.stepId}: stage ${stage} returned ${got}, expected ${want}`,
  );
}
