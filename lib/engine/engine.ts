import type { ModelConfig } from "../model/model_config.ts";
import type { LogitAdjust } from "./logit_adjust.ts";
import type { TopLogprobs } from "./top_logprobs.ts";

/** How one sequence picks its next token. temperature below MIN_TEMPERATURE (sampling.ts) means greedy (argmax). */
export interface SamplingParams {
  readonly temperature: number;
  /** Keep only the k most likely tokens; 0 keeps all. */
  readonly topK: number;
  /** Keep the smallest most-likely set whose probability reaches p; 1 keeps all. */
  readonly topP: number;
  /** Drop tokens less likely than minP times the most likely one; 0 keeps all. */
  readonly minP: number;
  /** With the position of the token being drawn, determines the random draw (see lib/rng.ts). */
  readonly seed: number;
}

export const GREEDY: SamplingParams = { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 };

/** One sequence's share of a step: a prefill chunk, or one decode token. */
export interface SeqInput {
  readonly seqId: number;
  /**
   * New token ids, written at positions startPos, startPos+1, ... Empty when
   * useLastSampled is set: the input is then the one token this sequence sampled in its
   * previous step, which may still be on the device.
   */
  readonly tokens: readonly number[];
  readonly useLastSampled?: boolean;
  /** Position of the first new token; positions before it are already in the KV cache. */
  readonly startPos: number;
  /** KV block ids covering positions [0, startPos + new tokens). */
  readonly blockTable: readonly number[];
  /** False for a prefill chunk that is not the prompt's last: nothing is sampled. */
  readonly sample: boolean;
  readonly sampling: SamplingParams;
  /**
   * Changes to the sampled row's logits before sampling (logit bias, penalties, min_tokens;
   * see logit_adjust.ts). The sampler, the returned logprob and `logits` all see the adjusted row.
   */
  readonly adjust?: LogitAdjust;
  /** Return this many of the row's most likely tokens with their logprobs (0..20; 0: none). */
  readonly topLogprobs?: number;
  /**
   * Constrained decoding: the ids this sample may take (lib/engine/token_mask.ts), one bit per
   * id; the sampler treats every other id's logit as -Infinity. Absent: every id.
   */
  readonly tokenMask?: Uint32Array;
  /**
   * A token mask that is not known yet when the step is planned (only to an engine with
   * `lateMasks`): the sequence feeds the token it sampled last, and the mask depends on that
   * token, so the scheduler computes it while the step's forward pass runs. The engine awaits
   * it before sampling the row and treats it as `tokenMask`.
   */
  readonly lateTokenMask?: Promise<Uint32Array>;
  /**
   * Return hidden states of this input's rows, after the final norm (what llama.cpp pools
   * into an embedding): "all" rows, or the "last" one. Only where the engine has
   * `hiddenStates`, and only for known tokens (not `useLastSampled`).
   */
  readonly hidden?: HiddenRows;
}

/** Which rows of a step's input come back as hidden states. */
export type HiddenRows = "all" | "last";

/** The hidden states of one sequence's rows in a step: `rows` × config.dim, row-major. */
export interface HiddenStates {
  readonly seqId: number;
  /** Position of the first row returned. */
  readonly startPos: number;
  readonly rows: Float32Array;
}

/** Everything the engine computes in one step, across all sequences. */
export interface StepPlan {
  readonly stepId: number;
  readonly seqs: readonly SeqInput[];
  /** Return the logits of each sampling sequence's last row (tests and the oracle). */
  readonly returnLogits?: boolean;
  /**
   * KV blocks to copy, every layer's K and V, before anything of the step is computed:
   * [source, destination] pairs, applied in order. A sequence that shares the first tokens of a
   * cached block gets a copy of it to write its next positions into (copy-on-write of a
   * partial block, lib/core/block_allocator.ts). Checked by validateStep (step_validation.ts).
   */
  readonly kvCopies?: readonly KvCopy[];
}

/** One block copy of a step: [source block, destination block]. */
export type KvCopy = readonly [number, number];

export interface SampledToken {
  readonly seqId: number;
  readonly token: number;
  /**
   * Natural log of the token's probability under softmax of the row's logits at temperature 1,
   * after the row's `adjust` (the raw logits when it has none), before temperature and the
   * top-k/top-p/min-p cuts.
   */
  readonly logprob: number;
  /** The row the sampler drew from (after `adjust`). */
  readonly logits?: Float32Array;
  /**
   * With `topLogprobs`: that many most likely tokens of the row (after `adjust`, temperature
   * 1; ties: the lower id first), with their logprobs.
   */
  readonly top?: TopLogprobs;
}

export interface StepResult {
  readonly stepId: number;
  /** One entry per sequence whose input had sample = true, in plan order. */
  readonly sampled: readonly SampledToken[];
  /** One entry per input that asked for `hidden`, in plan order. */
  readonly hidden?: readonly HiddenStates[];
  /**
   * How long the step kept the engine busy (device time, or the host's encoding of the next
   * step where that took longer), from an engine whose result comes later than that (a
   * readback): the scheduler keeps enough steps in flight to cover the rest
   * (lib/core/pipeline_depth.ts).
   */
  readonly busyMs?: number;
  /** With busyMs: how long the result then took to come back (the readback's latency). */
  readonly readbackMs?: number;
}

/** Geometry of the paged KV cache an engine owns. */
export interface KvGeometry {
  readonly numBlocks: number;
  readonly blockSize: number;
}

/**
 * A forward-pass engine over a ragged batch with a paged KV cache. step() may be called again
 * before an earlier step's promise resolves; steps execute in call order.
 */
export interface Engine {
  readonly name: string;
  readonly config: ModelConfig;
  readonly kv: KvGeometry;
  /** Set by engines whose step buffers are sized up front: no plan may exceed these. */
  readonly limits?: { readonly maxSeqs: number; readonly maxBatchTokens: number };
  /**
   * Takes `lateTokenMask`: awaits it between the forward pass and sampling, so a constrained
   * sequence decodes from its token in flight like an unconstrained one.
   */
  readonly lateMasks?: boolean;
  /**
   * A step's result is on the host when the step ends (no device readback to wait for), so
   * planning the next step only after it costs the planning gap and no more. The scheduler then
   * keeps backgroundDepth steps in flight while batch rows ride beside interactive decodes; an
   * engine whose results come back through a readback keeps its pipeline there instead.
   * `false` says they do come back through a readback (WebGPU): the default pipeline is then
   * DEFAULT_LIMITS.readbackPipelineDepth deep, to cover the readback's tick.
   */
  readonly resultsOnHost?: boolean;
  /**
   * The fixed part of a readback's latency, in ms, when resultsOnHost is false (WebGPU on
   * Deno: 10, the sleep before `mapAsync` resolves). With it, the serving core adapts its
   * pipeline depth to cover the readback at the step's measured cost (StepResult.busyMs), with
   * the latency each result measures (StepResult.readbackMs) replacing this first guess,
   * instead of always keeping DEFAULT_LIMITS.readbackPipelineDepth in flight
   * (lib/core/pipeline_depth.ts).
   */
  readonly readbackLatencyMs?: number;
  /** Returns hidden states where a plan's input asks (SeqInput.hidden): embeddings. */
  readonly hiddenStates?: boolean;
  step(plan: StepPlan): Promise<StepResult>;
  /**
   * The sequence is finished or preempted: forget its per-sequence state (last sampled token).
   * Ordered like a step: it takes effect after every step called before it, which may still
   * decode the token the sequence sampled last. A wrapper that defers steps defers releases too.
   */
  release?(seqId: number): void;
  dispose(): void;
}

/** New token rows a sequence adds in a step (a `useLastSampled` decode is one). */
export function inputLength(seq: SeqInput): number {
  return seq.useLastSampled ? 1 : seq.tokens.length;
}

/** Token rows a whole step computes: what the step's token budget counts. */
export function stepTokens(plan: StepPlan): number {
  return plan.seqs.reduce((n, s) => n + inputLength(s), 0);
}
