import { ApiError } from "./errors.ts";
import { parseRespelled, type Respelling } from "./respelled_error.ts";
import type { OpenAiOptions, Parsed } from "./openai_routes.ts";
import type {
  ResponsesBody,
  ResponsesFormat,
  ResponsesItem,
  ResponsesPart,
  ResponsesToolChoice,
} from "./responses_schema.ts";

/**
 * OpenAI's Responses requests as chat bodies: `instructions` as the first (system) message,
 * message items as messages (input_text and output_text parts as text), function_call items
 * as the tool_calls of an assistant message (consecutive calls one message, the call_id the
 * call's id), function_call_output items as tool messages, tools as functions, `text.format`
 * as response_format, max_output_tokens as max_tokens. The OpenAI parser (openai_routes.ts
 * parse) then checks them, so the limits and errors are the chat route's own; an error is
 * respelled with the Responses field the client sent.
 */

interface Mapped {
  readonly messages: Record<string, unknown>[];
  /** The Responses path each chat message came from, for respelled errors. */
  readonly sources: string[];
}

function text(content: string | readonly ResponsesPart[]): string {
  return typeof content === "string" ? content : content.map((p) => p.text).join("");
}

function chatMessages(instructions: string | null | undefined, items: readonly ResponsesItem[]) {
  const out: Mapped = { messages: [], sources: [] };
  const push = (m: Record<string, unknown>, source: string) => {
    out.messages.push(m);
    out.sources.push(source);
  };
  if (instructions !== undefined && instructions !== null) {
    push({ role: "system", content: instructions }, "instructions");
  }
  items.forEach((item, i) => {
    const at = `input[${i}]`;
    if (item.type === "function_call") {
      const call = {
        id: item.call_id,
        type: "function",
        function: { name: item.name, arguments: item.arguments },
      };
      const last = out.messages.at(-1);
      // Parallel calls are consecutive items: one assistant turn, as chat spells them.
      if (last?.role === "assistant" && Array.isArray(last.tool_calls)) {
        (last.tool_calls as unknown[]).push(call);
      } else push({ role: "assistant", content: null, tool_calls: [call] }, at);
      return;
    }
    if (item.type === "function_call_output") {
      const output = typeof item.output === "string"
        ? item.output
        : item.output.map((p) => p.text).join("");
      return push({ role: "tool", tool_call_id: item.call_id, content: output }, at);
    }
    const wrongPart = typeof item.content === "string"
      ? undefined
      : item.content.find((p) => (p.type === "output_text") !== (item.role === "assistant"));
    if (wrongPart) {
      throw new ApiError(
        "invalid_request",
        `Invalid '${at}.content': a ${item.role} message cannot hold an ${wrongPart.type} part ` +
          "(output_text parts are the assistant's, input_text parts the others')",
        `${at}.content`,
      );
    }
    push({ role: item.role, content: text(item.content) }, at);
  });
  return out;
}

function toolChoice(c: ResponsesToolChoice | undefined): unknown {
  if (c === undefined || typeof c === "string") return c;
  return { type: "function", function: { name: c.name } };
}

function responseFormat(f: ResponsesFormat | undefined): unknown {
  if (f === undefined || f.type === "text") return undefined;
  if (f.type === "json_object") return { type: "json_object" };
  const { type: _, ...schema } = f;
  return { type: "json_schema", json_schema: schema };
}

/** Chat parameter -> the Responses field it came from, most specific first. */
const RESPELL: Respelling = [
  ["max_tokens", "max_output_tokens"],
  ["response_format.json_schema", "text.format"],
  ["response_format", "text.format"],
  ["tool_choice.function.name", "tool_choice.name"],
];

/** A Responses body as the chat request it stands for. */
export function parseResponses(b: ResponsesBody, model: string, opts: OpenAiOptions): Parsed {
  const { messages, sources } = chatMessages(b.instructions, b.input);
  const format = responseFormat(b.text?.format);
  const body: Record<string, unknown> = {
    model,
    messages,
    ...(b.tools
      ? {
        tools: b.tools.map(({ type: _, ...f }) => ({ type: "function", function: f })),
      }
      : {}),
    ...(b.tool_choice !== undefined ? { tool_choice: toolChoice(b.tool_choice) } : {}),
    ...(format !== undefined ? { response_format: format } : {}),
  };
  if (b.max_output_tokens !== undefined) body.max_tokens = b.max_output_tokens;
  for (const f of ["temperature", "top_p"] as const) {
    if (b[f] !== undefined) body[f] = b[f];
  }
  return parseRespelled(body, "chat_completions", opts, RESPELL, {
    messages: sources,
    messageList: "input",
    toolField: (f) => f,
  });
}
