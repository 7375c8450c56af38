import { vocabularyProblem } from "../core/prompt_check.ts";
import type { LogitControls } from "../core/logit_controls.ts";
import { ApiError } from "./errors.ts";
import { PARAM_FIELDS } from "./request_params.ts";

/**
 * The request fields that change logits before sampling (their limits are request_params.ts's
 * rows: OpenAI's logit_bias and presence/frequency penalties, vLLM's repetition_penalty and
 * llama-server's spelling of it, repeat_penalty, with its window repeat_last_n), and vLLM's
 * stop controls. Zod fields for the OpenAI bodies (null: not given) and the WebSocket frame.
 */
export const logitControlFields = {
  logit_bias: PARAM_FIELDS.logit_bias.nullish(),
  presence_penalty: PARAM_FIELDS.presence_penalty.nullish(),
  frequency_penalty: PARAM_FIELDS.frequency_penalty.nullish(),
  repetition_penalty: PARAM_FIELDS.repetition_penalty.nullish(),
  repeat_penalty: PARAM_FIELDS.repetition_penalty.nullish(),
  repeat_last_n: PARAM_FIELDS.repeat_last_n.nullish(),
  min_tokens: PARAM_FIELDS.min_tokens.nullish(),
};

/** vLLM's stop controls: more token ids that end a generation, and generating past EOS. */
export const stopTokenFields = {
  stop_token_ids: PARAM_FIELDS.stop_token_ids.nullish(),
  ignore_eos: PARAM_FIELDS.ignore_eos.nullish(),
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
