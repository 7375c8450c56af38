import { z } from "zod";

/**
 * The one policy for fields of an OpenAI-style request body: a field is honoured, or accepted
 * because it cannot change the generated tokens, or refused with a 400 that names it. Nothing
 * that changes generation in OpenAI, vLLM or llama-server is dropped silently, and a field
 * none of the three has is refused as unknown (OpenAI answers "Unrecognized request argument"
 * too), so a misspelled `max_token` is an error rather than a request served with defaults.
 *
 * The refused fields below are features we do not implement. Each is still accepted at the
 * value that means "off" (its default in the server that has it) or as null, because clients
 * that mirror a server's whole parameter set send the defaults.
 */

interface Refused {
  /** Values that mean "off"; null is always accepted as "not given". */
  readonly off: readonly unknown[];
  /** What the feature is, for the error message. */
  readonly what: string;
}

const off = (what: string, ...values: unknown[]): Refused => ({ off: values, what });

/** Fields shared by /v1/completions and /v1/chat/completions that are refused unless off. */
// OpenAI's own (n, echo, best_of, tools, tool_choice) are in schemas.ts, with their types checked as well;
// the penalties and logit_bias, honoured, in sampling_controls.ts.
export const REFUSED_COMMON: Record<string, Refused> = {
  // vLLM
  length_penalty: off("length penalties (beam search)", 1),
  use_beam_search: off("beam search", false),
  include_stop_str_in_output: off("stop strings in the output", false),
  skip_special_tokens: off("printing special tokens", true),
  spaces_between_special_tokens: off("spacing options for special tokens", true),
  truncate_prompt_tokens: off("prompt truncation"),
  allowed_token_ids: off("allowed-token lists"),
  bad_words: off("banned words", []),
  prompt_logprobs: off("prompt logprobs", 0),
  guided_regex: off("guided decoding (regex)"),
  structured_outputs: off("structured outputs"),
  logits_processors: off("logits processors", []),
  // llama-server
  penalize_nl: off("newline penalties", false),
  typical_p: off("typical sampling", 1),
  tfs_z: off("tail-free sampling", 1),
  mirostat: off("Mirostat sampling", 0),
  mirostat_tau: off("Mirostat sampling", 5),
  mirostat_eta: off("Mirostat sampling", 0.1),
  dry_multiplier: off("DRY repetition penalties", 0),
  xtc_probability: off("XTC sampling", 0),
  top_n_sigma: off("top-n-sigma sampling", -1),
  dynatemp_range: off("dynamic temperature", 0),
  samplers: off("choosing the sampler order"),
  n_probs: off("top alternatives' probabilities", 0),
  t_max_predict_ms: off("a time limit on generation", 0),
};

/** Refused only on /v1/chat/completions (they shape the chat prompt or its output). */
export const REFUSED_CHAT: Record<string, Refused> = {
  functions: off("functions (tools)", []),
  function_call: off("functions (tools)", "none"),
  reasoning_effort: off("reasoning effort"),
  prediction: off("predicted outputs"),
  modalities: off("output modalities other than text", ["text"]),
  audio: off("audio output"),
  web_search_options: off("web search"),
  continue_final_message: off("continuing the final message", false),
  add_generation_prompt: off("chat prompts without the assistant's turn", true),
  chat_template: off("a chat template per request (start the server with --chat-template)"),
  documents: off("documents for the chat template"),
};

/**
 * Accepted and ignored: they describe the caller or the server's bookkeeping and cannot
 * change the tokens (`cache_prompt` only reuses a prefix, which our prefix cache does anyway).
 */
export const ACCEPTED_WITHOUT_EFFECT = [
  "metadata",
  "store",
  "service_tier",
  "safety_identifier",
  "prompt_cache_key",
  "parallel_tool_calls",
  "cache_prompt",
  "id_slot",
  "n_keep",
] as const;

function sameJson(a: unknown, b: unknown): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

function refusedField(name: string, r: Refused) {
  const values = r.off.map((v) => JSON.stringify(v)).join(" or ");
  const hint = values.length > 0 ? `send ${values}, null, or leave it out` : "leave it out";
  return z.unknown().refine((v) => v === null || r.off.some((o) => sameJson(o, v)), {
    error: `${name} is not supported: this server does not implement ${r.what} (${hint})`,
  }).optional();
}

/** Zod fields for a table of refused fields, to spread into a strict body schema. */
export function refusedFields(table: Record<string, Refused>) {
  const out: Record<string, ReturnType<typeof refusedField>> = {};
  for (const [name, r] of Object.entries(table)) out[name] = refusedField(name, r);
  return out;
}

/** Zod fields for ACCEPTED_WITHOUT_EFFECT (any JSON value). */
export function acceptedFields() {
  const out: Record<string, z.ZodOptional<z.ZodUnknown>> = {};
  for (const name of ACCEPTED_WITHOUT_EFFECT) out[name] = z.unknown().optional();
  return out;
}
