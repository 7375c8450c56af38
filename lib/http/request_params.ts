import { z } from "zod";
import { REPETITION_PENALTY } from "../core/logit_controls.ts";
import { MAX_TOP_LOGPROBS } from "../engine/top_logprobs.ts";
import { f32Problem } from "../util/f32_problem.ts";
import type { SamplingDefaults } from "../core/generation.ts";

/**
 * The one table of public generation parameters: each one's name, its spelling on every wire
 * (OpenAI bodies, which Batch lines carry as their `body`; WebSocket `generate` frames; the
 * cluster's NATS `generate` message; the `generate` command's flag), its limits and default.
 * Every request schema builds its fields from these rows (schemas.ts, sampling_controls.ts,
 * lib/cluster/messages.ts, lib/cli/generate.ts), so a limit is written here once;
 * tests/http_request_params_test.ts sends each row's boundaries through every layer, and
 * docs/parameters.md is generated from it (.ci/parameters_doc.ts) and checked against it.
 *
 * It sits in lib/http because every layer that spells a parameter (lib/batch, lib/cluster,
 * lib/cli) sits above it; nothing below lib/http reads a public parameter's limits (the
 * engines keep their own range checks on the internal values, which are wider).
 */

/** A number's limits; floats are checked as the f32 the engines compute with (f32_problem.ts). */
export interface NumberLimits {
  readonly kind: "int" | "float";
  readonly min?: number;
  readonly max?: number;
}

export type Limits =
  | NumberLimits
  | { readonly kind: "bool" }
  | { readonly kind: "enum"; readonly values: readonly string[] }
  /** A string, or an array of at most `maxItems` strings. */
  | { readonly kind: "strings"; readonly maxItems: number }
  /** An array of at most `maxItems` token ids. */
  | { readonly kind: "ids"; readonly maxItems: number }
  /** An object of token id → number within `values`. */
  | { readonly kind: "bias"; readonly values: NumberLimits };

export interface ParamRow {
  /** What it does, for docs/parameters.md. */
  readonly what: string;
  /** Its fields in /v1/completions and /v1/chat/completions bodies (and Batch lines' bodies). */
  readonly openai: readonly string[];
  /** Its field in a WebSocket `generate` frame; null: not on the WebSocket. */
  readonly ws: string | null;
  /**
   * Its path in the NATS `generate` message (router → replica); null: resolved by the router.
   * With `natsAs`, it travels transformed (the limits there are the internal value's).
   */
  readonly nats: string | null;
  readonly natsAs?: string;
  /** The `generate` command's flag; null: none. */
  readonly cli: string | null;
  readonly limits: Limits;
  /** The value a request that leaves it out gets (undefined: see defaultText). */
  readonly default?: number | string | boolean;
  /** The default in words, where it is not one value. */
  readonly defaultText?: string;
}

const float = (min: number, max: number): NumberLimits => ({ kind: "float", min, max });

/** The rows, by the parameter's OpenAI name. */
export const PARAMS = {
  max_tokens: {
    what:
      "Most tokens to generate (lowered to the room the context leaves, and the response says so)",
    openai: ["max_tokens", "max_completion_tokens (chat)", "n_predict (-1: up to the context)"],
    ws: "max_tokens",
    nats: "maxTokens",
    natsAs:
      "the tokens still to generate: capped to the context's room, on a failover what is left",
    cli: "--max-tokens, -n, --n-predict",
    limits: { kind: "int", min: 1, max: 1_000_000 },
    defaultText:
      "chat and WebSocket: up to the context; /v1/completions: 16 (OpenAI's); generate: 256",
  },
  temperature: {
    what: "Divides the logits before sampling; 0 (or below 1e-5) picks the most likely token",
    openai: ["temperature"],
    ws: "temperature",
    nats: "sampling.temperature",
    cli: "--temperature, --temp",
    limits: float(0, 2),
    default: 1,
  },
  top_k: {
    what: "Sample only among the k most likely tokens; 0: all",
    openai: ["top_k"],
    ws: "top_k",
    nats: "sampling.topK",
    cli: "--top-k",
    limits: { kind: "int", min: 0 },
    default: 0,
  },
  top_p: {
    what: "Sample only among the most likely tokens whose probabilities reach p; " +
      "0 keeps the most likely token only, 1: all",
    openai: ["top_p"],
    ws: "top_p",
    nats: "sampling.topP",
    cli: "--top-p",
    limits: float(0, 1),
    default: 1,
  },
  min_p: {
    what: "Drop tokens less likely than p times the most likely one; 0: off",
    openai: ["min_p"],
    ws: "min_p",
    nats: "sampling.minP",
    cli: "--min-p",
    limits: float(0, 1),
    default: 0,
  },
  seed: {
    what: "Makes sampling reproducible; the same seed and request give the same tokens",
    openai: ["seed"],
    ws: "seed",
    nats: "sampling.seed",
    natsAs: "mapped to 32 bits (values 0 to 2^32 - 1 as they are)",
    cli: "--seed",
    // Integers a double holds exactly: beyond +-(2^53 - 1) a JSON number is already rounded.
    limits: { kind: "int", min: Number.MIN_SAFE_INTEGER, max: Number.MAX_SAFE_INTEGER },
    defaultText: "a random one",
  },
  stop: {
    what: "Strings that end the generation; the matched text is not returned",
    openai: ["stop"],
    ws: "stop",
    nats: "stop",
    natsAs: "an array, with the chat format's own stops added",
    cli: null,
    limits: { kind: "strings", maxItems: 16 },
    defaultText: "none",
  },
  stop_token_ids: {
    what: "More token ids that end the generation (vLLM's)",
    openai: ["stop_token_ids"],
    ws: "stop_token_ids",
    nats: "stopTokenIds",
    natsAs: "distinct ids",
    cli: null,
    limits: { kind: "ids", maxItems: 256 },
    defaultText: "none",
  },
  ignore_eos: {
    what: "Generate past the end-of-generation tokens (vLLM's)",
    openai: ["ignore_eos"],
    ws: "ignore_eos",
    nats: "ignoreEos",
    cli: null,
    limits: { kind: "bool" },
    default: false,
  },
  min_tokens: {
    what: "The end-of-generation tokens and stop_token_ids cannot be sampled before this many",
    openai: ["min_tokens"],
    ws: "min_tokens",
    nats: "controls.minTokens",
    cli: null,
    limits: { kind: "int", min: 0 },
    default: 0,
  },
  logit_bias: {
    what: "Added to the logits of the given token ids",
    openai: ["logit_bias"],
    ws: "logit_bias",
    nats: "controls.logitBias",
    natsAs: "[id, bias] pairs by id, zeros left out",
    cli: null,
    limits: { kind: "bias", values: float(-100, 100) },
    defaultText: "none",
  },
  presence_penalty: {
    what: "Subtracted once from the logit of every token already generated",
    openai: ["presence_penalty"],
    ws: "presence_penalty",
    nats: "controls.presencePenalty",
    cli: null,
    limits: float(-2, 2),
    default: 0,
  },
  frequency_penalty: {
    what: "Subtracted from a token's logit once per time it was generated",
    openai: ["frequency_penalty"],
    ws: "frequency_penalty",
    nats: "controls.frequencyPenalty",
    cli: null,
    limits: float(-2, 2),
    default: 0,
  },
  repetition_penalty: {
    what:
      "Divides the positive logits (multiplies the negative) of the tokens in the window; 1: off",
    openai: ["repetition_penalty", "repeat_penalty (llama-server's; window 64 unless given)"],
    ws: "repetition_penalty, repeat_penalty",
    nats: "controls.repetitionPenalty",
    cli: null,
    limits: { kind: "float", ...REPETITION_PENALTY },
    default: 1,
  },
  repeat_last_n: {
    what: "The repetition penalty's window in tokens: -1 the whole sequence, 0 off",
    openai: ["repeat_last_n"],
    ws: "repeat_last_n",
    nats: "controls.repeatLastN",
    cli: null,
    limits: { kind: "int", min: -1 },
    defaultText: "-1 (64 under repeat_penalty, as llama-server)",
  },
  priority: {
    what: "Scheduling class: batch work yields to interactive work",
    openai: ["priority"],
    ws: "priority",
    nats: "priority",
    cli: null,
    limits: { kind: "enum", values: ["interactive", "batch"] },
    default: "interactive",
  },
  logprobs: {
    what: "Return each token's logprob (completions: an integer, the alternatives per token)",
    openai: [`logprobs (chat: true/false; completions: 0..${MAX_TOP_LOGPROBS} alternatives)`],
    ws: "logprobs",
    nats: "logprobs",
    cli: null,
    limits: { kind: "bool" },
    default: false,
  },
  top_logprobs: {
    what: "With logprobs: this many most likely alternatives per token",
    openai: ["top_logprobs (chat)", "logprobs (completions)"],
    ws: "top_logprobs",
    nats: "topLogprobs",
    cli: null,
    limits: { kind: "int", min: 0, max: MAX_TOP_LOGPROBS },
    default: 0,
  },
  n: {
    what: "Choices to generate for the one prompt",
    openai: ["n"],
    ws: null,
    nats: null,
    cli: null,
    limits: { kind: "int", min: 1, max: 16 },
    default: 1,
  },
} as const satisfies Record<string, ParamRow>;

export type ParamName = keyof typeof PARAMS;

/** A row's number limits (throws for a row that is not a number: a programming error). */
export function numberLimits(name: ParamName): NumberLimits {
  const l: Limits = PARAMS[name].limits;
  if (l.kind !== "int" && l.kind !== "float") throw new Error(`${name} is not a number`);
  return l;
}

/** A zod number within `l`; a float is checked as an f32 too (f32_problem.ts). */
export function numberSchema(l: NumberLimits, base: z.ZodNumber = z.number()): z.ZodType<number> {
  let s = l.kind === "int" ? base.int() : base;
  if (l.min !== undefined) s = s.min(l.min);
  if (l.max !== undefined) s = s.max(l.max);
  if (l.kind === "int") return s;
  const bounds = { min: l.min, max: l.max };
  return s.superRefine((v, ctx) => {
    const problem = f32Problem(v, bounds);
    if (problem !== undefined) ctx.addIssue({ code: "custom", message: problem });
  });
}

/** A token id: what the vocabulary check (prompt_check.ts) later bounds from above. */
export const tokenId = z.number().int().min(0);

const strings = (maxItems: number) =>
  z.union([z.string(), z.array(z.string()).max(maxItems)], {
    error: `expected a string or an array of at most ${maxItems} strings`,
  });

const number = (name: ParamName) => numberSchema(numberLimits(name));

/**
 * Each row's zod schema as a client sends it (OpenAI body, Batch line, WebSocket frame), built
 * from its limits. The OpenAI and WebSocket schemas add `.nullish()` / `.optional()`.
 */
export const PARAM_FIELDS = {
  max_tokens: number("max_tokens"),
  temperature: number("temperature"),
  top_k: number("top_k"),
  top_p: number("top_p"),
  min_p: number("min_p"),
  seed: number("seed"),
  stop: strings(PARAMS.stop.limits.maxItems),
  stop_token_ids: z.array(tokenId).max(PARAMS.stop_token_ids.limits.maxItems),
  ignore_eos: z.boolean(),
  min_tokens: number("min_tokens"),
  logit_bias: z.record(z.string(), numberSchema(PARAMS.logit_bias.limits.values)).superRefine(
    (b, ctx) => {
      for (const key of Object.keys(b)) {
        if (/^(0|[1-9][0-9]{0,9})$/.test(key)) continue;
        ctx.addIssue({
          code: "custom",
          path: [key],
          message: `'${key.slice(0, 40)}' is not a token id (keys must be token ids: 0, 1, 2, ...)`,
        });
      }
    },
  ),
  presence_penalty: number("presence_penalty"),
  frequency_penalty: number("frequency_penalty"),
  repetition_penalty: number("repetition_penalty"),
  repeat_last_n: number("repeat_last_n"),
  priority: z.enum(PARAMS.priority.limits.values),
  logprobs: z.boolean(),
  top_logprobs: number("top_logprobs"),
  n: number("n"),
} as const satisfies Record<ParamName, z.ZodType>;

/**
 * A number row as a `generate` flag (a row of lib/cli/settings.ts): the text is read as a
 * number, then the row's limits apply. An empty text is no number, not 0, and the message is
 * the settings' own ("must be a number").
 */
export function flagNumber(name: ParamName): z.ZodType<number> {
  return z.preprocess(
    (v) => typeof v === "string" ? (v.trim() === "" ? Number.NaN : Number(v)) : v,
    numberSchema(
      numberLimits(name),
      // Only the type's message: the limits keep theirs, the table's.
      z.number({ error: (i) => i.code === "invalid_type" ? "must be a number" : undefined }),
    ),
  );
}

/** The row's default as the number it is (throws where the row has no single default). */
export function numberDefault(name: ParamName): number {
  const d = (PARAMS[name] as ParamRow).default;
  if (typeof d !== "number") throw new Error(`${name} has no number default`);
  return d;
}

/**
 * What a request that names no temperature, top_k, top_p or min_p gets: the model's own
 * default (its entry in lib/cli/models_config.ts), else the row's, OpenAI's (temperature 1,
 * top_p 1; top_k 0 and min_p 0 are off).
 */
export function samplingDefaults(model: SamplingDefaults = {}): Required<SamplingDefaults> {
  return {
    temperature: model.temperature ?? numberDefault("temperature"),
    topK: model.topK ?? numberDefault("top_k"),
    topP: model.topP ?? numberDefault("top_p"),
    minP: model.minP ?? numberDefault("min_p"),
  };
}
