import { vocabularyProblem } from "../core/prompt_check.ts";
import { z } from "zod";
import { type LogitControls, REPETITION_PENALTY } from "../core/logit_controls.ts";
import { ApiError } from "./errors.ts";
import { f32Number } from "../util/f32_number.ts";

/**
 * The request fields that change logits before sampling, with the ranges of the servers that
 * define them: OpenAI's logit_bias (-100..100) and presence/frequency penalties (-2..2), vLLM's
 * repetition_penalty ([1e-6, 2]: REPETITION_PENALTY) and llama-server's spelling of it, repeat_penalty, with its
 * window repeat_last_n (-1: the whole sequence, 0: off).
 */
const penalty = f32Number({ min: -2, max: 2 });
const repetition = f32Number(REPETITION_PENALTY);

/** Zod fields for the OpenAI bodies (null: not given) and the WebSocket frame. */
export const logitControlFields = {
  logit_bias: z.record(z.string(), f32Number({ min: -100, max: 100 })).superRefine((b, ctx) => {
    for (const key of Object.keys(b)) {
      if (/^(0|[1-9][0-9]{0,9})$/.test(key)) continue;
      ctx.addIssue({
        code: "custom",
        path: [key],
        message: `'${key.slice(0, 40)}' is not a token id (keys must be token ids: 0, 1, 2, ...)`,
      });
    }
  }).nullish(),
  presence_penalty: penalty.nullish(),
  frequency_penalty: penalty.nullish(),
  repetition_penalty: repetition.nullish(),
  repeat_penalty: repetition.nullish(),
  repeat_last_n: z.number().int().min(-1).nullish(),
  // vLLM's: the end-of-sequence tokens and stop_token_ids cannot be sampled before this many.
  min_tokens: z.number().int().min(0).nullish(),
};

/** vLLM's stop controls: more token ids that end a generation, and generating past EOS. */
export const stopTokenFields = {
  stop_token_ids: z.array(z.number().int().min(0)).max(256).nullish(),
  ignore_eos: z.boolean().nullish(),
};

/** llama-server's window when its repeat_penalty is given without one. */
export const LLAMA_SERVER_REPEAT_LAST_N = 64;

type Fields = {
  logit_bias?: Record<string, number> | null;
  presence_penalty?: number | null;
  frequency_penalty?: number | null;
  repetition_penalty?: number | null;
  repeat_penalty?: number | null;
  repeat_last_n?: number | null;
  min_tokens?: number | null;
};

/**
 * The controls a parsed body asks for, or undefined when it asks for none. vLLM's and
 * llama-server's spellings of the repetition penalty may both be given only with one value;
 * under llama-server's spelling the window defaults to llama-server's 64 tokens, under vLLM's
 * to the whole sequence (vLLM has no window).
 */
export function logitControlsFrom(b: Fields): LogitControls | undefined {
  if (
    b.repetition_penalty != null && b.repeat_penalty != null &&
    b.repetition_penalty !== b.repeat_penalty
  ) {
    throw new ApiError(
      "invalid_request",
      `Invalid 'repeat_penalty': it is another name for repetition_penalty, and the two differ ` +
        `(repetition_penalty ${b.repetition_penalty}, repeat_penalty ${b.repeat_penalty}); send one`,
      "repeat_penalty",
    );
  }
  const bias = Object.entries(b.logit_bias ?? {})
    .map(([id, v]) => [Number(id), v] as const)
    .filter(([, v]) => v !== 0)
    .sort((x, y) => x[0] - y[0]);
  const repetition = b.repetition_penalty ?? b.repeat_penalty ?? 1;
  const window = b.repeat_last_n ??
    (b.repeat_penalty != null && b.repetition_penalty == null ? LLAMA_SERVER_REPEAT_LAST_N : -1);
  const c: LogitControls = {
    ...(bias.length > 0 ? { logitBias: bias } : {}),
    ...(b.presence_penalty ? { presencePenalty: b.presence_penalty } : {}),
    ...(b.frequency_penalty ? { frequencyPenalty: b.frequency_penalty } : {}),
    ...(repetition !== 1 && window !== 0
      ? { repetitionPenalty: repetition, repeatLastN: window }
      : {}),
    ...(b.min_tokens ? { minTokens: b.min_tokens } : {}),
  };
  return Object.keys(c).length > 0 ? c : undefined;
}

/** Refuses a stop_token_ids id outside the model's vocabulary, naming it. */
export function checkStopTokenIds(
  ids: readonly number[] | undefined,
  vocab: number | undefined,
): void {
  checkTokenIds(ids, vocab, "stop_token_ids");
}

/** Refuses ids outside the model's vocabulary as the request's `param`, naming the first. */
export function checkTokenIds(
  ids: readonly number[] | undefined,
  vocab: number | undefined,
  param: string,
): void {
  const problem = ids === undefined ? undefined : vocabularyProblem(ids, vocab);
  if (problem !== undefined) {
    throw new ApiError("invalid_request", `Invalid '${param}': ${problem}`, param);
  }
}

/** Refuses a logit_bias id outside the model's vocabulary, naming it. */
export function checkLogitBiasIds(c: LogitControls | undefined, vocab: number | undefined): void {
  if (c?.logitBias === undefined || vocab === undefined) return;
  const bad = c.logitBias.find(([id]) => id >= vocab);
  if (bad !== undefined) {
    throw new ApiError(
      "invalid_request",
      `Invalid 'logit_bias': token id ${
        bad[0]
      } is outside the model's vocabulary of ${vocab} ids ` +
        `(0 to ${vocab - 1}); got ${bad[0]}`,
      "logit_bias",
    );
  }
}
