import type { GenerationErrorCode } from "./generation.ts";
import { logitControlsProblem } from "./logit_controls.ts";
import { outsideVocabulary, promptProblem } from "./prompt_check.ts";
import type { SchedulerConfig } from "./scheduler_config.ts";
import type { SeqSpec } from "./seq_events.ts";
import { DRAINING_MESSAGE } from "./draining.ts";

export interface Refusal {
  readonly code: GenerationErrorCode;
  readonly message: string;
}

/** What the scheduler's state says about one more submission. */
export interface QueueState {
  readonly live: (seqId: number) => boolean;
  readonly healthy: boolean;
  readonly draining: boolean;
  readonly running: number;
  readonly waiting: number;
}

/** A lone sequence must always fit the pool, or preemption could never make room for it. */
export function promptLimit(config: SchedulerConfig): number {
  return Math.min(config.contextLength, config.numBlocks * config.blockSize);
}

/**
 * Why a submission is refused, if it is: only what would let one request fail a step shared
 * with others, or what the queue cannot take (the edge validates requests).
 */
export function submissionRefusal(
  spec: SeqSpec,
  config: SchedulerConfig,
  q: QueueState,
): Refusal | undefined {
  const { seqId, prompt } = spec;
  if (q.live(seqId)) {
    return { code: "internal", message: `Cannot submit sequence ${seqId}: the id is already live` };
  }
  if (!q.healthy) return { code: "internal", message: "Cannot submit: the executor is down" };
  if (q.draining) return { code: "draining", message: DRAINING_MESSAGE };
  // Those that can start at the next step are not queued for the purpose of overload.
  const freeSlots = Math.max(0, config.maxRunning - q.running);
  const queued = q.waiting - freeSlots;
  if (queued >= config.maxWaiting) {
    return {
      code: "overloaded",
      message:
        `Cannot submit: ${queued} requests are waiting beyond the ${freeSlots} free running slots, the limit is ${config.maxWaiting}`,
    };
  }
  if (prompt.length === 0) {
    return {
      code: "internal",
      message: `Cannot submit sequence ${seqId}: the prompt has no tokens`,
    };
  }
  const vocab = config.vocabSize;
  const bad = outsideVocabulary(prompt, vocab);
  if (bad >= 0) {
    return {
      code: "internal",
      message: `Cannot submit: prompt token ${bad} is ${
        prompt[bad]
      }, outside the vocabulary of ${vocab} ids`,
    };
  }
  const controls = spec.controls === undefined
    ? undefined
    : logitControlsProblem(spec.controls, vocab);
  if (controls !== undefined) {
    return { code: "internal", message: `Cannot submit sequence ${seqId}: ${controls}` };
  }
  // The edge's prompt rule (prompt_check.ts) again, for what reaches the core by other ways;
  // the KV pool bounds a prompt too when it holds less than the context.
  const limit = promptLimit(config);
  return promptProblem(prompt.length, {
    contextLength: limit,
    ...(limit < config.contextLength ? { holder: "the KV cache" } : {}),
  });
}
