import { z } from "zod";

/**
 * The shapes of Ollama's request bodies (its docs/api.md). Only the shapes are checked here:
 * the values that map onto the OpenAI request (sampling, limits, tools, format) are left as
 * they came and checked by the OpenAI parser (openai_routes.ts parse), with their errors
 * respelled in Ollama's field names (ollama_request.ts). Strict: a misspelled or unsupported
 * field is an error naming it, never ignored.
 */

/** Taken as sent: the OpenAI parser checks it. */
const passed = z.unknown().optional();

/** A field refused unless it has the value (or values) meaning "off". */
function offOnly(what: string, ...off: unknown[]) {
  return z.unknown().refine((v) => v === null || off.some((o) => o === v), {
    error: `${what} is not supported here (leave it out${
      off.length > 0 ? ` or send ${off.map((o) => JSON.stringify(o)).join(" or ")}` : ""
    })`,
  }).optional();
}

/** A process setting of Ollama's runner, which a request cannot change here. */
const serverSetting = z.unknown().refine(() => false, {
  error: "it is a setting of the server process here (its flags and models file), " +
    "not of a request; leave it out",
}).optional();

export const OllamaOptions = z.strictObject({
  temperature: passed,
  top_k: passed,
  top_p: passed,
  min_p: passed,
  seed: passed,
  num_predict: passed,
  stop: passed,
  repeat_penalty: passed,
  repeat_last_n: passed,
  presence_penalty: passed,
  frequency_penalty: passed,
  // The OpenAI body's refusals (request_fields.ts) answer these.
  typical_p: passed,
  tfs_z: passed,
  mirostat: passed,
  mirostat_tau: passed,
  mirostat_eta: passed,
  penalize_newline: passed,
  num_ctx: z.number().int().min(1).optional(),
  num_keep: offOnly("num_keep (keeping tokens when the context shifts; prompts never shift here)"),
  numa: serverSetting,
  num_batch: serverSetting,
  num_gpu: serverSetting,
  main_gpu: serverSetting,
  low_vram: serverSetting,
  f16_kv: serverSetting,
  logits_all: serverSetting,
  vocab_only: serverSetting,
  use_mmap: serverSetting,
  use_mlock: serverSetting,
  embedding_only: serverSetting,
  num_thread: serverSetting,
});
export type OllamaOptions = z.output<typeof OllamaOptions>;

const noImages = z.array(z.unknown()).max(0, {
  error: "images are not supported: the models served here read text only",
}).nullish();

/** A call in an assistant message (arguments are an object, not JSON text as in OpenAI's). */
const OllamaToolCall = z.strictObject({
  id: z.string().optional(),
  function: z.strictObject({
    index: z.number().int().min(0).optional(),
    name: z.string(),
    arguments: z.record(z.string(), z.unknown(), { error: "expected an object" }),
  }),
});
export type OllamaToolCall = z.output<typeof OllamaToolCall>;

export const OllamaMessage = z.strictObject({
  role: z.enum(["system", "user", "assistant", "tool"], {
    error: 'expected one of "system", "user", "assistant", "tool"',
  }),
  content: z.string().optional(),
  images: noImages,
  tool_calls: z.array(OllamaToolCall).nullish(),
  tool_name: z.string().optional(),
  // An earlier answer's reasoning, as clients send it back: Ollama's templates drop it from
  // the prompt, and so does this server.
  thinking: z.string().optional(),
});
export type OllamaMessage = z.output<typeof OllamaMessage>;

/** Fields /api/chat and /api/generate share. */
const common = {
  model: z.string({ error: "expected the model's name" }),
  stream: z.boolean().nullish(),
  format: z.union([z.literal(""), z.literal("json"), z.record(z.string(), z.unknown())], {
    error: 'expected "json" or a JSON schema object',
  }).nullish(),
  options: OllamaOptions.nullish(),
  // How long Ollama keeps the model loaded after the request: models stay loaded here as the
  // server was started, so any value is accepted and changes nothing.
  keep_alive: z.union([z.string(), z.number()]).nullish(),
  think: offOnly("thinking (reasoning output apart from the answer)", false),
  logprobs: offOnly("logprobs on Ollama's API (use /v1/chat/completions)", false),
  top_logprobs: offOnly("top_logprobs on Ollama's API (use /v1/chat/completions)", 0),
};

export const OllamaChatBody = z.strictObject({
  ...common,
  messages: z.array(OllamaMessage).nullish(),
  tools: z.array(z.unknown()).nullish(),
});
export type OllamaChatBody = z.output<typeof OllamaChatBody>;

export const OllamaGenerateBody = z.strictObject({
  ...common,
  prompt: z.string().nullish(),
  system: z.string().nullish(),
  raw: z.boolean().nullish(),
  images: noImages,
  suffix: offOnly("suffix (fill-in-the-middle)", ""),
  template: offOnly(
    "a template per request (the model's chat template is used; for a prompt of your own " +
      "send raw: true)",
    "",
  ),
  context: z.array(z.unknown()).max(0, {
    error: "context (the token ids of an earlier answer) is not supported: send the whole " +
      "conversation in the prompt, or use /api/chat",
  }).nullish(),
});
export type OllamaGenerateBody = z.output<typeof OllamaGenerateBody>;

/** Options of an embedding request: none of Ollama's options changes a pooled vector here. */
const noOptions = z.strictObject({}, {
  error: "options change nothing in an embedding here; leave them out",
}).nullish();

/** POST /api/embed: one input or several. */
export const OllamaEmbedBody = z.strictObject({
  model: z.string({ error: "expected the model's name" }),
  input: z.union([z.string(), z.array(z.string()).min(1)], {
    error: "expected a string or a non-empty array of strings",
  }),
  // Ollama cuts inputs past the context by default; here they are refused either way, never
  // cut, so the flag is accepted and changes nothing.
  truncate: z.boolean().optional(),
  dimensions: z.number().int().positive().optional(),
  keep_alive: z.union([z.string(), z.number()]).nullish(),
  options: noOptions,
});
export type OllamaEmbedBody = z.output<typeof OllamaEmbedBody>;

/** POST /api/embeddings, the older route: one prompt. */
export const OllamaEmbeddingsBody = z.strictObject({
  model: z.string({ error: "expected the model's name" }),
  prompt: z.string(),
  keep_alive: z.union([z.string(), z.number()]).nullish(),
  options: noOptions,
});

/** /api/show and /api/pull name the model as `model` (older clients: `name`). */
export const OllamaModelBody = z.object({
  model: z.string().optional(),
  name: z.string().optional(),
});
