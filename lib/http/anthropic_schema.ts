import { z } from "zod";
import { jsonSchemaObject } from "./response_format.ts";

/**
 * The shapes of Anthropic's Messages API bodies (POST /v1/messages and its count_tokens).
 * Only shapes are checked here: the values that map onto the OpenAI request (max_tokens,
 * sampling, stop_sequences, tool schemas) are checked by the OpenAI parser
 * (openai_routes.ts parse), their errors respelled in Anthropic's names
 * (anthropic_request.ts). Strict: an unsupported field or block is an error naming it.
 */

/** Prompt-caching hints: the prefix cache reuses prompts anyway, so they change nothing. */
const cacheControl = z.unknown().optional();

const TextBlock = z.strictObject({
  type: z.literal("text"),
  text: z.string(),
  cache_control: cacheControl,
  // Citations an earlier answer carried, sent back: this server never makes them.
  citations: z.array(z.unknown()).max(0, { error: "citations are not supported" }).nullish(),
});

const ToolUseBlock = z.strictObject({
  type: z.literal("tool_use"),
  id: z.string().min(1),
  name: z.string(),
  input: z.record(z.string(), z.unknown(), { error: "expected an object" }),
  cache_control: cacheControl,
});

const ToolResultBlock = z.strictObject({
  type: z.literal("tool_result"),
  tool_use_id: z.string().min(1),
  content: z.union([z.string(), z.array(TextBlock)], {
    error: 'expected a string or text blocks ({type: "text", text}); images are not supported',
  }).optional(),
  is_error: z.boolean().optional(),
  cache_control: cacheControl,
});

const BLOCK_TYPES = ["text", "tool_use", "tool_result"];

/** A content block: text, tool_use or tool_result; anything else refused by its type. */
const ContentBlock = z.discriminatedUnion("type", [TextBlock, ToolUseBlock, ToolResultBlock], {
  error: (issue) => {
    const type = (issue.input as { type?: unknown } | undefined)?.type;
    return typeof type === "string" && !BLOCK_TYPES.includes(type)
      ? `content blocks of type "${type}" are not supported (the models served here read ` +
        "text only): send text, tool_use or tool_result blocks"
      : "expected a content block of type text, tool_use or tool_result";
  },
});
export type AnthropicBlock = z.output<typeof ContentBlock>;

export const AnthropicMessage = z.strictObject({
  role: z.enum(["user", "assistant"], { error: 'expected "user" or "assistant"' }),
  content: z.union([z.string(), z.array(ContentBlock)], {
    // For an array, the blocks' own complaint (an image block names its type), not the union's.
    error: (issue) => {
      const inner = issue.code === "invalid_union" ? issue.errors[1]?.[0] : undefined;
      const at = inner?.path.filter((k) => typeof k === "number")[0];
      return Array.isArray(issue.input) && inner
        ? `block ${at ?? 0}: ${inner.message.replace(/^Invalid input: /, "")}`
        : "expected a string or an array of content blocks";
    },
  }),
});
export type AnthropicMessage = z.output<typeof AnthropicMessage>;

const AnthropicTool = z.strictObject({
  // Server tools (web search, code execution...) have types of their own: not run here.
  type: z.literal("custom", {
    error: 'only client tools are supported (type "custom" or none); server tools such as ' +
      "web search are not run here",
  }).optional(),
  name: z.string(),
  description: z.string().optional(),
  input_schema: jsonSchemaObject,
  cache_control: cacheControl,
});
export type AnthropicTool = z.output<typeof AnthropicTool>;

const parallel = { disable_parallel_tool_use: z.boolean().optional() };
export const AnthropicToolChoice = z.discriminatedUnion("type", [
  z.strictObject({ type: z.literal("auto"), ...parallel }),
  z.strictObject({ type: z.literal("any"), ...parallel }),
  z.strictObject({ type: z.literal("tool"), name: z.string(), ...parallel }),
  z.strictObject({ type: z.literal("none") }),
], { error: 'expected {type: "auto"}, {type: "any"}, {type: "tool", name} or {type: "none"}' });
export type AnthropicToolChoice = z.output<typeof AnthropicToolChoice>;

/** The fields of a request's prompt: what count_tokens takes too. */
const prompt = {
  model: z.string({ error: "expected the model's name" }),
  messages: z.array(AnthropicMessage).min(1),
  system: z.union([z.string(), z.array(TextBlock)], {
    error: "expected a string or text blocks",
  }).optional(),
  tools: z.array(AnthropicTool).optional(),
  tool_choice: AnthropicToolChoice.optional(),
  thinking: z.unknown().refine(
    (v) => v === null || (typeof v === "object" && (v as { type?: unknown }).type === "disabled"),
    { error: 'extended thinking is not supported: send {type: "disabled"} or leave it out' },
  ).optional(),
};

export const AnthropicCountBody = z.strictObject(prompt);
export type AnthropicCountBody = z.output<typeof AnthropicCountBody>;

export const AnthropicMessagesBody = z.strictObject({
  ...prompt,
  max_tokens: z.number({ error: "expected a number" }),
  stop_sequences: z.unknown().optional(),
  temperature: z.unknown().optional(),
  top_p: z.unknown().optional(),
  top_k: z.unknown().optional(),
  stream: z.boolean().optional(),
  // Structured output: the answer's text is JSON valid under the schema.
  output_config: z.strictObject({
    format: z.strictObject({
      type: z.literal("json_schema"),
      schema: jsonSchemaObject,
    }).nullish(),
    effort: z.null({ error: "effort (reasoning effort) is not supported; leave it out" })
      .optional(),
  }).optional(),
  // A prompt-caching hint for the whole request (see cacheControl).
  cache_control: cacheControl,
  // Who asks (user_id) and which capacity tier: neither can change the tokens.
  metadata: z.strictObject({ user_id: z.string().nullish() }).optional(),
  service_tier: z.enum(["auto", "standard_only"]).optional(),
  // Ours, as on the OpenAI routes: a batch line runs at batch priority.
  priority: z.unknown().optional(),
});
export type AnthropicMessagesBody = z.output<typeof AnthropicMessagesBody>;
