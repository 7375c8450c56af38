import { z } from "zod";
import { jsonSchemaObject } from "./response_format.ts";

/**
 * The shape of OpenAI's Responses API body (POST /v1/responses), stateless subset. Only shapes
 * are checked here: the values that map onto the chat request (max_output_tokens, sampling,
 * tool and output schemas) are checked by the OpenAI parser (openai_routes.ts parse), their
 * errors respelled in the Responses names (responses_request.ts). Strict: an unsupported
 * field, item or part is an error naming it.
 */

const STATELESS = "responses are not stored here: the server keeps no state between requests";

const InputText = z.strictObject({ type: z.literal("input_text"), text: z.string() });

/** An assistant's text as an earlier response gave it (clients send the output back). */
const OutputText = z.strictObject({
  type: z.literal("output_text"),
  text: z.string(),
  annotations: z.array(z.unknown()).max(0, { error: "annotations are not supported" })
    .optional(),
  logprobs: z.array(z.unknown()).optional(),
});

const PART_TYPES = ["input_text", "output_text"];

const ContentPart = z.discriminatedUnion("type", [InputText, OutputText], {
  error: (issue) => {
    const type = (issue.input as { type?: unknown } | undefined)?.type;
    return typeof type === "string" && !PART_TYPES.includes(type)
      ? `content parts of type "${type}" are not supported (the models served here read text ` +
        "only): send input_text parts"
      : "expected a content part of type input_text or output_text";
  },
});
export type ResponsesPart = z.output<typeof ContentPart>;

const MessageItem = z.strictObject({
  type: z.literal("message").optional(),
  role: z.enum(["user", "assistant", "system", "developer"], {
    error: 'expected "user", "assistant", "system" or "developer"',
  }),
  content: z.union([z.string(), z.array(ContentPart)], {
    // For an array, the parts' own complaint (an image part names its type), not the union's.
    error: (issue) => {
      const inner = issue.code === "invalid_union" ? issue.errors[1]?.[0] : undefined;
      const at = inner?.path.filter((k) => typeof k === "number")[0];
      return Array.isArray(issue.input) && inner
        ? `part ${at ?? 0}: ${inner.message.replace(/^Invalid input: /, "")}`
        : "expected a string or an array of content parts";
    },
  }),
  // An earlier response's message item, sent back as it came.
  id: z.string().optional(),
  status: z.string().optional(),
});

const FunctionCallItem = z.strictObject({
  type: z.literal("function_call"),
  call_id: z.string().min(1),
  name: z.string(),
  arguments: z.string(),
  id: z.string().optional(),
  status: z.string().optional(),
});

const FunctionCallOutputItem = z.strictObject({
  type: z.literal("function_call_output"),
  call_id: z.string().min(1),
  output: z.union([z.string(), z.array(InputText)], {
    error: "expected a string or input_text parts; images and files are not supported",
  }),
  id: z.string().nullish(),
  status: z.string().nullish(),
});

const ITEM_TYPES = ["message", "function_call", "function_call_output"];

const InputItem = z.discriminatedUnion("type", [
  MessageItem,
  FunctionCallItem,
  FunctionCallOutputItem,
], {
  error: (issue) => {
    const type = (issue.input as { type?: unknown } | undefined)?.type;
    return typeof type === "string" && !ITEM_TYPES.includes(type)
      ? `input items of type "${type}" are not supported: send message, function_call or ` +
        "function_call_output items" +
        (type === "item_reference" ? ` (${STATELESS}, so send the items themselves)` : "")
      : "expected an input item (a message, function_call or function_call_output)";
  },
});
export type ResponsesItem = z.output<typeof InputItem>;

const FunctionTool = z.strictObject({
  type: z.literal("function", {
    error: 'only tools of type "function" are supported; hosted tools (web search, file ' +
      "search...) are not run here",
  }),
  name: z.string(),
  description: z.string().nullish(),
  parameters: jsonSchemaObject
    .nullish(),
  strict: z.boolean().nullish(),
});
export type ResponsesTool = z.output<typeof FunctionTool>;

export const ResponsesToolChoice = z.union([
  z.enum(["none", "auto", "required"]),
  z.strictObject({ type: z.literal("function"), name: z.string() }),
], { error: 'expected "none", "auto", "required" or {type: "function", name}' });
export type ResponsesToolChoice = z.output<typeof ResponsesToolChoice>;

const Format = z.discriminatedUnion("type", [
  z.strictObject({ type: z.literal("text") }),
  z.strictObject({ type: z.literal("json_object") }),
  z.strictObject({
    type: z.literal("json_schema"),
    name: z.string(),
    schema: jsonSchemaObject,
    description: z.string().nullish(),
    strict: z.boolean().nullish(),
  }),
], { error: 'expected a format of type "text", "json_object" or "json_schema"' });
export type ResponsesFormat = z.output<typeof Format>;

export const ResponsesBody = z.strictObject({
  model: z.string().nullish(),
  // A string is one user message: as items, an error names the item and part it is in.
  input: z.preprocess(
    (v) => typeof v === "string" ? [{ role: "user", content: v }] : v,
    z.array(InputItem, { error: "expected a string or an array of input items" }).min(1),
  ),
  instructions: z.string().nullish(),
  tools: z.array(FunctionTool).optional(),
  tool_choice: ResponsesToolChoice.optional(),
  text: z.strictObject({
    format: Format.optional(),
    verbosity: z.literal("medium", { error: 'only "medium" verbosity is supported' }).nullish(),
  }).nullish(),
  max_output_tokens: z.unknown().optional(),
  temperature: z.unknown().optional(),
  top_p: z.unknown().optional(),
  stream: z.boolean().nullish(),
  // Stateless: nothing is kept, so nothing can be continued, fetched later or run detached.
  store: z.literal(false, {
    error: `store: true is not supported: ${STATELESS}; send store: false or leave it out ` +
      "(it defaults to false here)",
  }).nullish(),
  previous_response_id: z.null({
    error: `previous_response_id is not supported: ${STATELESS}; send the whole conversation ` +
      "in input",
  }).optional(),
  conversation: z.null({ error: `conversations are not supported: ${STATELESS}` }).optional(),
  background: z.literal(false, {
    error: "background is not supported: responses are answered while the client waits",
  }).nullish(),
  reasoning: z.null({ error: "reasoning options are not supported; leave them out" }).optional(),
  include: z.array(z.unknown()).max(0, { error: "include is not supported; leave it out" })
    .nullish(),
  truncation: z.literal("disabled", {
    error: 'only "disabled" truncation is supported: a prompt over the context is an error',
  }).nullish(),
  // One constrained call at most, and who asks or how it is billed: they cannot change tokens.
  parallel_tool_calls: z.boolean().nullish(),
  metadata: z.record(z.string(), z.string()).nullish(),
  user: z.string().nullish(),
  safety_identifier: z.string().nullish(),
  prompt_cache_key: z.string().nullish(),
  service_tier: z.string().nullish(),
});
export type ResponsesBody = z.output<typeof ResponsesBody>;
