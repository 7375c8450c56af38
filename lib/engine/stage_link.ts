import type { StepPlan, StepResult } from "./engine.ts";

/** Layers [start, end) of a model: what one pipeline stage runs. */
export interface LayerRange {
  readonly start: number;
  readonly end: number;
}

/** What a stage's step gives: the residual rows for the next stage, or the last's result. */
export type StageOutput =
  | { readonly kind: "rows"; readonly rows: Float32Array }
  | { readonly kind: "result"; readonly result: StepResult };

/**
 * One pipeline stage as the head drives it: the CPU engine of a layer range in this process
 * (kernels/wasm/wasm_engine.ts's stepStage) or one in another process (lib/cluster/stage_client.ts).
 * Steps and releases take effect in call order.
 */
export interface StageLink {
  readonly stage: LayerRange;
  /**
   * The first stage embeds the plan's tokens; a later one takes the residual rows the stage
   * before returned. The last returns the step's result. A plan holds no `useLastSampled`
   * input and no `lateTokenMask`: the head resolves both before it sends.
   */
  stepStage(plan: StepPlan, input?: Float32Array): Promise<StageOutput>;
  release?(seqId: number): void;
  dispose(): void;
}
