import { z } from "zod";
import { acceptedFields, REFUSED_CHAT, REFUSED_COMMON, refusedFields } from "./request_fields.ts";
import { logitControlFields, stopTokenFields } from "./sampling_controls.ts";
import { constraintFields, frameConstraintFields } from "./response_format.ts";
import { FunctionTool, MessageToolCall, ToolChoice } from "../chat/tools.ts";
import { PARAM_FIELDS, tokenId } from "./request_params.ts";

/**
 * Shapes of everything a client sends: WebSocket frames (strict: a misspelled field is an
 * error, not silently ignored) and OpenAI request bodies (strict too, with the field policy of
 * request_fields.ts: honoured, accepted without effect, or refused by name).
 */

const {
  max_tokens: maxTokens,
  temperature,
  top_k: topK,
  top_p: topP,
  min_p: minP,
  seed,
  stop,
  priority,
} = PARAM_FIELDS;

/**
 * The sampling fields with their wire names and ranges: what a request may set, and so what a
 * model's entry in the models file (lib/cli/models_config.ts) may set as its default.
 */
export const SAMPLING_FIELDS = { temperature, top_k: topK, top_p: topP, min_p: minP } as const;

/** A generation id on the WebSocket: what the client uses to tell its generations apart. */
const generationId = z.string().min(1).max(128);

/** Chat message content: a string, or OpenAI content parts of which only text is supported. */
const messageContent = z.union([
  z.string(),
  z.array(z.object({ type: z.literal("text"), text: z.string() })),
], { error: 'expected a string or an array of {type: "text", text} parts' });

const chatRole = z.enum(["system", "developer", "user", "assistant"]);

const wsMessage = z.strictObject({ role: chatRole, content: z.string() });

/**
 * Variables for the chat template beside `messages` (vLLM's and llama-server's field), e.g.
 * Qwen3's `{"enable_thinking": false}`. The variables the server sets itself are refused
 * rather than let to override it: the messages, the model's own BOS/EOS text, and the
 * generation prompt (a chat completion always ends with the assistant's turn).
 */
export const RESERVED_TEMPLATE_VARIABLES = [
  "messages",
  "bos_token",
  "eos_token",
  "add_generation_prompt",
  "tools",
] as const;
const chatTemplateKwargs = z.record(z.string(), z.unknown()).superRefine((kw, ctx) => {
  for (const name of RESERVED_TEMPLATE_VARIABLES) {
    if (name in kw) {
      ctx.addIssue({
        code: "custom",
        path: [name],
        message: `'${name}' is set by the server and cannot be given as a template variable`,
      });
    }
  }
});

export const GenerateFrame = z.strictObject({
  type: z.literal("generate"),
  id: generationId,
  prompt: z.string().optional(),
  messages: z.array(wsMessage).min(1).optional(),
  chat_template_kwargs: chatTemplateKwargs.optional(),
  max_tokens: maxTokens.optional(),
  temperature: temperature.optional(),
  top_k: topK.optional(),
  top_p: topP.optional(),
  min_p: minP.optional(),
  seed: seed.optional(),
  stop: stop.optional(),
  priority: priority.optional(),
  logprobs: PARAM_FIELDS.logprobs.optional(),
  top_logprobs: PARAM_FIELDS.top_logprobs.optional(),
  ...logitControlFields,
  ...stopTokenFields,
  ...frameConstraintFields,
  tools: z.never({
    error: "tools are not supported on the WebSocket protocol; use POST /v1/chat/completions",
  }).optional(),
  tool_choice: z.never({
    error: "tools are not supported on the WebSocket protocol; use POST /v1/chat/completions",
  }).optional(),
}).superRefine((f, ctx) => {
  if ((f.top_logprobs ?? 0) > 0 && f.logprobs !== true) {
    ctx.addIssue({
      code: "custom",
      path: ["top_logprobs"],
      message: "top_logprobs needs logprobs: true",
    });
  }
  if ((f.prompt === undefined) === (f.messages === undefined)) {
    ctx.addIssue({
      code: "custom",
      path: f.prompt === undefined ? ["prompt"] : ["messages"],
      message: f.prompt === undefined
        ? "one of 'prompt' or 'messages' is required"
        : "give 'prompt' or 'messages', not both",
    });
  }
  if (f.chat_template_kwargs !== undefined && f.messages === undefined) {
    ctx.addIssue({
      code: "custom",
      path: ["chat_template_kwargs"],
      message: "template variables apply to 'messages' only (a 'prompt' is not templated)",
    });
  }
});
export type GenerateFrame = z.output<typeof GenerateFrame>;

export const CancelFrame = z.strictObject({ type: z.literal("cancel"), id: generationId });
export type CancelFrame = z.output<typeof CancelFrame>;

export const SubscribeStatsFrame = z.strictObject({ type: z.literal("subscribe_stats") });
export const UnsubscribeStatsFrame = z.strictObject({ type: z.literal("unsubscribe_stats") });

/** Client frame types and their schemas; anything else is refused as "unknown_type". */
export const CLIENT_FRAMES = {
  generate: GenerateFrame,
  cancel: CancelFrame,
  subscribe_stats: SubscribeStatsFrame,
  unsubscribe_stats: UnsubscribeStatsFrame,
} as const;
export type ClientFrameType = keyof typeof CLIENT_FRAMES;

/** Fields shared by both OpenAI endpoints. Null is accepted wherever OpenAI clients send it. */
const openAiCommon = {
  ...acceptedFields(),
  ...refusedFields(REFUSED_COMMON),
  model: z.string().nullish(),
  max_tokens: maxTokens.nullish(),
  // llama-server's name for max_tokens; its -1 means "until the context is full".
  n_predict: z.union([z.literal(-1), maxTokens], {
    error: "expected -1 (up to the context) or a positive integer",
  }).nullish(),
  temperature: temperature.nullish(),
  top_p: topP.nullish(),
  top_k: topK.nullish(),
  min_p: minP.nullish(),
  seed: seed.nullish(),
  stop: stop.nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish() }).nullish(),
  priority: priority.nullish(),
  n: PARAM_FIELDS.n.nullish(),
  ...logitControlFields,
  ...stopTokenFields,
  user: z.string().nullish(),
  // Ours: false answers the request from no cache (exact or similar questions).
  cache: z.boolean().nullish(),
  ...constraintFields,
};

const tokenIds = z.array(tokenId).min(1);

export const CompletionBody = z.strictObject({
  ...openAiCommon,
  prompt: z.union([
    z.string(),
    tokenIds,
    z.array(z.string()).length(1),
    z.array(tokenIds).length(1),
  ], {
    error: "expected a string, an array of token ids, or a one-element array of either " +
      "(batched prompts are not supported)",
  }),
  // The sampled tokens' logprobs, with this many top alternatives each (OpenAI's limit).
  logprobs: PARAM_FIELDS.top_logprobs.nullish(),
  echo: z.boolean().nullish(),
  best_of: z.literal(1, { error: "only best_of = 1 is supported" }).nullish(),
  suffix: z.null({ error: "suffix is not supported" }).optional(),
});
export type CompletionBody = z.output<typeof CompletionBody>;

export const ChatMessage = z.strictObject({
  role: z.enum(["system", "developer", "user", "assistant", "tool"], {
    error: 'expected one of "system", "developer", "user", "assistant", "tool"',
  }),
  // Null only on an assistant message with tool_calls (checked in tools.ts chatTurns).
  content: messageContent.nullish(),
  name: z.string().nullish(),
  tool_calls: z.array(MessageToolCall).nullish(),
  tool_call_id: z.string().nullish(),
  // An assistant message as a response gave it (clients send it back as is): its refusal text
  // stands for the content when there is none.
  refusal: z.string().nullish(),
  // Added to a response's message by the openai SDK's helpers (chat.completions.stream,
  // .parse): accepted back, without effect.
  parsed: z.unknown().optional(),
  annotations: z.array(z.unknown()).nullish(),
  // Never in our answers; accepted only as "none".
  audio: z.null({ error: "audio is not supported" }).optional(),
  function_call: z.null({ error: "function_call is not supported; use tool_calls" }).optional(),
});
export type ChatMessage = z.output<typeof ChatMessage>;

export const ChatCompletionBody = z.strictObject({
  ...openAiCommon,
  ...refusedFields(REFUSED_CHAT),
  chat_template_kwargs: chatTemplateKwargs.nullish(),
  messages: z.array(ChatMessage).min(1),
  max_completion_tokens: maxTokens.nullish(),
  logprobs: PARAM_FIELDS.logprobs.nullish(),
  top_logprobs: PARAM_FIELDS.top_logprobs.nullish(),
  tools: z.array(FunctionTool).max(128).nullish(),
  tool_choice: ToolChoice.nullish(),
});
export type ChatCompletionBody = z.output<typeof ChatCompletionBody>;

/**
 * POST /tokenize in llama-server's shape (`content`, `add_special`, `parse_special`,
 * `with_pieces`) or vLLM's (`prompt` or `messages`, `add_special_tokens`,
 * `add_generation_prompt`); exactly one of content, prompt and messages.
 */
export const TokenizeBody = z.strictObject({
  model: z.string().nullish(),
  content: z.string().optional(),
  prompt: z.string().optional(),
  messages: z.array(ChatMessage).min(1).optional(),
  add_special: z.boolean().optional(),
  parse_special: z.boolean().optional(),
  with_pieces: z.boolean().optional(),
  add_special_tokens: z.boolean().optional(),
  add_generation_prompt: z.boolean().optional(),
  chat_template_kwargs: chatTemplateKwargs.nullish(),
});
export type TokenizeBody = z.output<typeof TokenizeBody>;

/** POST /detokenize: `{tokens}` in both servers' shapes (vLLM adds an optional `model`). */
export const DetokenizeBody = z.strictObject({
  model: z.string().nullish(),
  tokens: z.array(tokenId),
});
