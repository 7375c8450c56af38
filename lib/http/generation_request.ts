import { seedToU32 } from "../util/rng.ts";
import type {
  GenerationBackend,
  GenerationRequest,
  Priority,
  SimilarQuestion,
} from "../core/generation.ts";
import { ApiError } from "./errors.ts";
import { completionRoom, promptProblem } from "../core/prompt_check.ts";
import type { LogitControls } from "../core/logit_controls.ts";
import { checkLogitBiasIds, checkStopTokenIds } from "./sampling_controls.ts";
import { samplingDefaults } from "./request_params.ts";
import type { OutputConstraint } from "../grammar/output_constraint.ts";

/** Client parameters after validation, before limits are applied (all APIs map to this). */
export interface GenerationInput {
  readonly prompt: string | readonly number[];
  /** Field to blame when the prompt is too long ("prompt" or "messages"). */
  readonly promptParam: string;
  readonly maxTokens?: number | null | undefined;
  /** When the client gives no max_tokens: a number, or undefined for "up to the context". */
  readonly defaultMaxTokens?: number;
  readonly temperature?: number | null | undefined;
  readonly topK?: number | null | undefined;
  readonly topP?: number | null | undefined;
  readonly minP?: number | null | undefined;
  readonly seed?: number | null | undefined;
  readonly stop?: string | readonly string[] | null | undefined;
  /** Stops the prompt format adds (plain chat format), merged with the client's. */
  readonly extraStop?: readonly string[];
  /**
   * The prompt text was rendered by the model's chat template: text spelling a control token
   * ("</s>", "<|im_start|>") is that token. Never set for text the client wrote directly.
   */
  readonly specialTokens?: boolean;
  readonly priority?: Priority | null | undefined;
  readonly logprobs?: boolean;
  /** With logprobs: alternatives per token (request_params.ts's top_logprobs). */
  readonly topLogprobs?: number | null | undefined;
  /** Logit bias and penalties (sampling_controls.ts), checked but for the vocabulary. */
  readonly controls?: LogitControls;
  /** More ids that end the generation (vLLM's stop_token_ids). */
  readonly stopTokenIds?: readonly number[] | null | undefined;
  /** Generate past the end-of-generation tokens (vLLM's ignore_eos). */
  readonly ignoreEos?: boolean | null | undefined;
  /** Constrained decoding (response_format, json_schema, grammar). */
  readonly constraint?: OutputConstraint;
  /** A chat's question and its context (the cache for similar questions). */
  readonly similar?: SimilarQuestion;
  /** The client's `cache: false`: answered by no cache. */
  readonly noCache?: boolean;
}

function randomSeed(): number {
  return crypto.getRandomValues(new Uint32Array(1))[0] ?? 0;
}

/**
 * The one mapping from a client's request (OpenAI body, Batch line, WebSocket frame, the
 * router's HTTP front) to the internal request: tokenizes the prompt once (the request carries
 * the ids; nothing below this sees text), refuses a prompt that leaves no room in the context
 * (with its token count and the limit; never truncates), caps max_tokens to what the context
 * has left, fills defaults, and draws a seed when none is given. The end-of-generation ids are
 * added once, by the request actor (actors/request.ts), which every backend's work reaches.
 *
 * `maxTokensCapped` is true when the context had less room than the max_tokens asked for (or
 * the default): the limit is lowered rather than the request refused, and the responses say so.
 * A request is `deterministic` when greedy or explicitly seeded (the result cache's condition).
 */
export function buildGenerationRequest(
  input: GenerationInput,
  backend: Pick<
    GenerationBackend,
    "tokenize" | "minTokens" | "contextLength" | "vocabSize" | "samplingDefaults"
  >,
  requestId: string,
): { request: GenerationRequest; promptTokens: number; maxTokensCapped: boolean } {
  checkLogitBiasIds(input.controls, backend.vocabSize);
  checkStopTokenIds(input.stopTokenIds ?? undefined, backend.vocabSize);
  const atLeast = typeof input.prompt === "string" ? backend.minTokens?.(input.prompt) ?? 0 : 0;
  if (atLeast >= backend.contextLength) {
    throw new ApiError(
      "context_length_exceeded",
      `The prompt is at least ${atLeast} tokens (${
        (input.prompt as string).length
      } characters) but the model's context is ${backend.contextLength} tokens; shorten it to ` +
        `at most ${backend.contextLength - 1} tokens`,
      input.promptParam,
    );
  }
  const prompt = typeof input.prompt === "string"
    ? backend.tokenize(input.prompt, { bos: true, special: input.specialTokens ?? false })
    : input.prompt;
  const promptTokens = prompt.length;
  const problem = promptProblem(typeof input.prompt === "string" ? promptTokens : prompt, {
    contextLength: backend.contextLength,
    ...(backend.vocabSize === undefined ? {} : { vocabSize: backend.vocabSize }),
  });
  if (problem !== undefined) {
    throw new ApiError(
      problem.code,
      problem.code === "invalid_request"
        ? `Invalid '${input.promptParam}': ${problem.message}`
        : problem.message,
      input.promptParam,
    );
  }
  const room = completionRoom(promptTokens, backend.contextLength);
  const asked = input.maxTokens ?? input.defaultMaxTokens ?? room;
  const minTokens = input.controls?.minTokens ?? 0;
  if (minTokens > Math.min(asked, room)) {
    throw new ApiError(
      "invalid_request",
      `Invalid 'min_tokens': it is above the ${
        Math.min(asked, room)
      } tokens this request may generate (max_tokens, or the room the context leaves); got ${minTokens}`,
      "min_tokens",
    );
  }
  if (minTokens > 0 && input.constraint !== undefined) {
    // Once the constrained output is complete only a stop token may follow, which min_tokens
    // forbids: one of the two would be broken silently (vLLM then samples from an all-masked
    // row). Refused instead, so the client chooses.
    throw new ApiError(
      "invalid_request",
      `Invalid 'min_tokens': it cannot be combined with an output constraint (response_format, ` +
        `json_schema, grammar, guided_*): a complete constrained output must end at once; got ${minTokens}`,
      "min_tokens",
    );
  }
  const stop = input.stop === undefined || input.stop === null
    ? []
    : typeof input.stop === "string"
    ? [input.stop]
    : [...input.stop];
  for (const s of input.extraStop ?? []) if (!stop.includes(s)) stop.push(s);
  const d = samplingDefaults(backend.samplingDefaults);
  const temperature = input.temperature ?? d.temperature;
  const seeded = input.seed !== undefined && input.seed !== null;
  const request: GenerationRequest = {
    prompt,
    maxTokens: Math.min(asked, room),
    sampling: {
      temperature,
      topK: input.topK ?? d.topK,
      topP: input.topP ?? d.topP,
      minP: input.minP ?? d.minP,
      seed: seeded ? seedToU32(input.seed as number) : randomSeed(),
    },
    stop: stop.filter((s) => s.length > 0),
    ...(input.controls !== undefined ? { controls: input.controls } : {}),
    ...(input.stopTokenIds?.length ? { stopTokenIds: [...new Set(input.stopTokenIds)] } : {}),
    ...(input.ignoreEos ? { ignoreEos: true } : {}),
    priority: input.priority ?? "interactive",
    requestId,
    logprobs: input.logprobs ?? false,
    ...(input.logprobs && input.topLogprobs ? { topLogprobs: input.topLogprobs } : {}),
    deterministic: temperature === 0 || seeded,
    ...(input.constraint ? { constraint: input.constraint } : {}),
    ...(input.similar && !input.noCache ? { similar: input.similar } : {}),
    ...(input.noCache ? { noCache: true } : {}),
  };
  return { request, promptTokens, maxTokensCapped: asked > room };
}
