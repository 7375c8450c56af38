/**
 * The one source of the defaults an engine is sized by: the KV geometry, the step's rows and
 * sequences, and the pipeline. The settings table (and so `--help`), the scheduler, the actors
 * and the engines all read them from here, so a layer can never run with a default another
 * layer does not know about. The scheduler's policy (queue, aging, batch pacing, faults) is
 * lib/core/scheduler_config.ts's SCHEDULER_DEFAULTS.
 */
export const DEFAULT_LIMITS = {
  /** Tokens per KV block. */
  blockSize: 16,
  /**
   * Memory for the paged KV cache, as the `--kv-memory` flag takes it; "auto" sizes it from the
   * model and the device (lib/engine/kv_budget.ts planKvCache).
   */
  kvMemory: "auto",
  /** Token rows one step computes (prefill chunk tokens + one per decode). */
  maxBatchTokens: 512,
  /** Sequences holding KV blocks, and so sharing a step, at once. */
  maxRunning: 64,
  /**
   * Steps submitted before the oldest one's tokens are read back. Deeper pipelines hide more
   * readback latency (measured on llvmpipe: 2 -> 147, 3 -> 198, 4 -> 264 tokens/s
   * single-stream) at the cost of steps computed past a stop.
   */
  pipelineDepth: 3,
  /**
   * pipelineDepth for engines whose results come back through a device readback (WebGPU).
   * Deno resolves a buffer mapping no sooner than its 10 ms poll tick, so a single stream
   * decodes at most this many steps per tick: 3 held stories260K to ~205 tokens/s on llvmpipe,
   * 8 its ~2 ms steps to ~500, and 16 lets its ~1 ms steps with workgroups inline run back to
   * back (555 -> 939 tokens/s through the server). Steps past a stop cost a batch row; the
   * scheduler keeps fewer in flight when steps are long (lib/core/pipeline_depth.ts).
   */
  readbackPipelineDepth: 16,
  /** The deepest pipeline allowed: each level costs a step computed past every stop. */
  maxPipelineDepth: 16,
  /**
   * Share of the KV pool a new admission must leave free for running sequences to grow: the
   * scheduler keeps it, and the KV plan sizes the pool with it.
   */
  watermarkFraction: 0.01,
  /** Plans one WebGPU submit may encode. */
  maxStepsPerSubmit: 8,
} as const;

/**
 * The pipeline depth an engine gets when none is configured: readbackPipelineDepth for one
 * whose results come back through a device readback (`Engine.resultsOnHost` false), else
 * pipelineDepth: an engine that waits for no readback tick gains nothing deeper.
 */
export function defaultPipelineDepth(resultsOnHost: boolean | undefined): number {
  return resultsOnHost === false
    ? DEFAULT_LIMITS.readbackPipelineDepth
    : DEFAULT_LIMITS.pipelineDepth;
}
