/**
 * The one prompt rule: every id is one of the model's, and the prompt leaves at least one
 * position of the context for the completion. The edge applies it before anything runs (HTTP's
 * buildGenerationRequest, the router through the same HTTP layer, `generate`), and the scheduler
 * applies it again to what reaches the core by other ways (a replica's NATS requests, tests and
 * benchmarks on a bare ServingCore), with the KV pool as the bound when the pool is the smaller.
 *
 * The engines' step validation (lib/engine/step_validation.ts) is a different rule on a
 * different thing: every position a step plan writes is inside the context. A plan the
 * scheduler built wrongly (a completion grown past the context) breaks it; a prompt does not.
 */
import { isTokenId } from "../engine/step_validation.ts";

/** Index of the first id that is not a token id of a vocabulary of `vocabSize` ids, or -1. */
export function outsideVocabulary(ids: readonly number[], vocabSize: number): number {
  return ids.findIndex((t) => !isTokenId(t, vocabSize));
}

/**
 * Why `ids` are not all ids of the model's vocabulary, or undefined: the first one outside it,
 * by value and index. The text names no field; callers put it after theirs.
 */
export function vocabularyProblem(
  ids: readonly number[],
  vocabSize: number | undefined,
): string | undefined {
  if (vocabSize === undefined || vocabSize <= 0) return undefined;
  const at = outsideVocabulary(ids, vocabSize);
  if (at < 0) return undefined;
  return `token id ${ids[at]} at index ${at} is outside the model's vocabulary of ${vocabSize} ` +
    `ids (0 to ${vocabSize - 1})`;
}

/** Positions a completion may have after a prompt of `promptTokens` (< 1: it cannot run). */
export function completionRoom(promptTokens: number, contextLength: number): number {
  return contextLength - promptTokens;
}

export interface PromptLimits {
  readonly contextLength: number;
  /** Ids 0..vocabSize-1; undefined (or 0): not checked. */
  readonly vocabSize?: number;
  /** What holds `contextLength` tokens, for the message (default "the model's context"). */
  readonly holder?: string;
}

export interface PromptProblem {
  readonly code: "invalid_request" | "context_length_exceeded";
  /** A sentence that names no field (a vocabulary problem) or starts with "The prompt". */
  readonly message: string;
}

/**
 * Why a prompt (its ids, or only its token count when it is still text) cannot run on a model
 * with these limits, or undefined when it can.
 */
export function promptProblem(
  prompt: readonly number[] | number,
  limits: PromptLimits,
): PromptProblem | undefined {
  if (typeof prompt !== "number") {
    const vocabulary = vocabularyProblem(prompt, limits.vocabSize);
    if (vocabulary !== undefined) return { code: "invalid_request", message: vocabulary };
  }
  const n = typeof prompt === "number" ? prompt : prompt.length;
  const limit = limits.contextLength;
  if (completionRoom(n, limit) >= 1) return undefined;
  return {
    code: "context_length_exceeded",
    message: `The prompt is ${n} tokens but ${limits.holder ?? "the model's context"} is ` +
      `${limit} tokens, which leaves no room for a completion; shorten it to at most ${
        limit - 1
      } tokens`,
  };
}
