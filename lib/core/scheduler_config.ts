import { DEFAULT_LIMITS } from "../engine/limits.ts";

export interface SchedulerConfig {
  /** KV pool geometry: take it from the engine (engine.kv). */
  readonly numBlocks: number;
  readonly blockSize: number;
  /** Longest prompt + completion (engine.config.contextLength). */
  readonly contextLength: number;
  /** Token budget of one step (prefill chunk tokens + one per decode). */
  readonly maxBatchTokens: number;
  /** Most sequences holding KV blocks at once. */
  readonly maxRunning: number;
  /**
   * Most sequences waiting that cannot start at the next step (beyond the free running slots);
   * more submissions are refused as "overloaded".
   */
  readonly maxWaiting: number;
  /** Steps after which a batch request ranks like an interactive one. */
  readonly agingSteps: number;
  /**
   * Steps in flight while batch-rank work is live (alone, or riding beside rank-0 decodes): an
   * interactive arrival then waits behind at most this many steps holding batch rows instead of
   * the whole pipeline.
   */
  readonly backgroundDepth: number;
  /** Free blocks a new admission must leave for the running sequences to grow into. */
  readonly watermarkBlocks: number;
  /**
   * A sequence in this many steps that crashed the engine is failed instead of recomputed
   * again, so one poisonous request cannot keep the engine restarting forever.
   */
  readonly maxSeqFaults: number;
  /** Prompt token ids must be below this (0: unchecked); one bad id would fail a whole step. */
  readonly vocabSize: number;
  readonly prefixCaching: boolean;
  /**
   * The engine takes late token masks (Engine.lateMasks): a constrained sequence then decodes
   * from its token in flight, its mask computed while the step runs.
   */
  readonly lateMasks: boolean;
  /**
   * The engine's results are on the host when a step ends (Engine.resultsOnHost): steps of
   * interactive decodes beside live batch work then keep backgroundDepth in flight, not the
   * pipeline, since an interactive arrival waits behind every step in flight holding batch rows.
   */
  readonly shallowBesideBatch: boolean;
}

/**
 * The one source of the scheduler's policy defaults: the settings table (and so `--help`), the
 * scheduler and the scheduler actor read them from here. The step's rows and sequences are the
 * engine's geometry (lib/engine/limits.ts), which the scheduler must stay within.
 */
export const SCHEDULER_DEFAULTS = {
  maxBatchTokens: DEFAULT_LIMITS.maxBatchTokens,
  maxRunning: DEFAULT_LIMITS.maxRunning,
  /** Sequences queued beyond those that can start now before a submission is "overloaded". */
  maxWaiting: 256,
  /** Steps after which a batch request ranks like an interactive one. */
  agingSteps: 256,
  /**
   * Steps in flight while batch work runs, alone or beside interactive decodes (below
   * pipelineDepth): an interactive request arriving then waits behind this many steps holding
   * batch rows, not a full pipeline of them. Only a step for an interactive prefill goes deeper.
   */
  backgroundDepth: 1,
  /**
   * Share of the engine's time batch-only steps may take while interactive requests arrived in
   * the last backgroundQuietMs: after a batch-only step of d ms the next waits d × (1/share − 1),
   * so an interactive arrival finds the engine (and, on the CPU engine, the cores) free more
   * often. Without recent interactive traffic batch work runs back to back.
   */
  backgroundShare: 0.5,
  backgroundQuietMs: 1000,
  prefixCaching: true,
  /** Steps that crashed the engine after which a sequence is failed, not recomputed again. */
  maxSeqFaults: 4,
  vocabSize: 0,
  lateMasks: false,
  shallowBesideBatch: false,
} as const;

/** Fills in the defaults above; the watermark is a share of the pool (lib/engine/limits.ts). */
export function schedulerConfig(
  required: Pick<SchedulerConfig, "numBlocks" | "blockSize" | "contextLength">,
  overrides: Partial<SchedulerConfig> = {},
): SchedulerConfig {
  const { backgroundShare: _s, backgroundQuietMs: _q, ...policy } = SCHEDULER_DEFAULTS;
  const cfg = {
    ...policy,
    watermarkBlocks: Math.ceil(required.numBlocks * DEFAULT_LIMITS.watermarkFraction),
    ...required,
    ...overrides,
  };
  for (
    const key of [
      "numBlocks",
      "blockSize",
      "contextLength",
      "maxBatchTokens",
      "maxRunning",
      "backgroundDepth",
    ] as const
  ) {
    if (!Number.isInteger(cfg[key]) || cfg[key] < 1) {
      throw new RangeError(
        `Cannot create scheduler: ${key} must be a positive integer, received ${cfg[key]}`,
      );
    }
  }
  return cfg;
}
