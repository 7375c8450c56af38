import { ApiError } from "./errors.ts";
import { parseRespelled, type Respelling } from "./respelled_error.ts";
import type { OpenAiOptions, Parsed } from "./openai_routes.ts";
import type {
  AnthropicBlock,
  AnthropicCountBody,
  AnthropicMessage,
  AnthropicMessagesBody,
  AnthropicToolChoice,
} from "./anthropic_schema.ts";

/**
 * Anthropic's Messages requests as OpenAI chat bodies: `system` as the first message, text
 * blocks as text parts, an assistant's tool_use blocks as its tool_calls (the block's id is
 * the call's), a user's tool_result blocks as tool messages before its text, tools as
 * functions with `input_schema` as `parameters`, tool_choice any/tool as required/named. The
 * OpenAI parser (openai_routes.ts parse) then checks them, so the limits and errors are the
 * OpenAI routes' own; an error is respelled with the Anthropic field the client sent.
 */

/** A message's text blocks as OpenAI text parts. */
function textParts(blocks: readonly AnthropicBlock[]) {
  return blocks.flatMap((b) => b.type === "text" ? [{ type: "text", text: b.text }] : []);
}

/** A tool result's text; an error result says so, as the model cannot see the flag. */
function resultText(b: Extract<AnthropicBlock, { type: "tool_result" }>): string {
  const c = b.content ?? "";
  const text = typeof c === "string" ? c : c.map((p) => p.text).join("");
  return b.is_error ? `Error: ${text}` : text;
}

interface Mapped {
  readonly messages: Record<string, unknown>[];
  /** The Anthropic path each OpenAI message came from, for respelled errors. */
  readonly sources: string[];
}

function openAiMessages(system: AnthropicCountBody["system"], messages: AnthropicMessage[]) {
  const out: Mapped = { messages: [], sources: [] };
  const push = (m: Record<string, unknown>, source: string) => {
    out.messages.push(m);
    out.sources.push(source);
  };
  if (system !== undefined) {
    push({
      role: "system",
      content: typeof system === "string" ? system : system.map((b) => b.text).join(""),
    }, "system");
  }
  messages.forEach((m, i) => {
    const at = `messages[${i}]`;
    if (typeof m.content === "string") return push({ role: m.role, content: m.content }, at);
    const misplaced = m.content.find((b) =>
      (b.type === "tool_use" && m.role === "user") ||
      (b.type === "tool_result" && m.role === "assistant")
    );
    if (misplaced) {
      throw new ApiError(
        "invalid_request",
        `Invalid '${at}.content': a ${m.role} message cannot hold a ${misplaced.type} block ` +
          `(tool_use blocks are the assistant's, tool_result blocks the user's)`,
        `${at}.content`,
      );
    }
    if (m.role === "assistant") {
      const calls = m.content.flatMap((b) =>
        b.type === "tool_use"
          ? [{
            id: b.id,
            type: "function",
            function: { name: b.name, arguments: JSON.stringify(b.input) },
          }]
          : []
      );
      const text = textParts(m.content);
      return push({
        role: "assistant",
        content: text.length > 0 || calls.length === 0 ? text : null,
        ...(calls.length > 0 ? { tool_calls: calls } : {}),
      }, at);
    }
    for (const b of m.content) {
      if (b.type === "tool_result") {
        push({ role: "tool", tool_call_id: b.tool_use_id, content: resultText(b) }, at);
      }
    }
    const text = textParts(m.content);
    if (text.length > 0 || m.content.length === 0) push({ role: "user", content: text }, at);
  });
  const last = messages.at(-1);
  if (last?.role === "assistant") {
    throw new ApiError(
      "invalid_request",
      `Invalid 'messages[${messages.length - 1}]': a final assistant message (a prefill the ` +
        "answer continues) is not supported: the answer is always a new assistant turn",
      `messages[${messages.length - 1}]`,
    );
  }
  return out;
}

function toolChoice(c: AnthropicToolChoice | undefined): unknown {
  if (c === undefined) return undefined;
  if (c.type === "any") return "required";
  if (c.type === "tool") return { type: "function", function: { name: c.name } };
  return c.type;
}

/** OpenAI parameter -> the Anthropic field it came from, most specific first. */
const RESPELL: Respelling = [
  ["stop", "stop_sequences"],
  ["response_format.json_schema.schema", "output_config.format.schema"],
  ["response_format", "output_config.format"],
  ["tool_choice.function.name", "tool_choice.name"],
];

/** A Messages (or count_tokens) body as the OpenAI chat request. */
export function parseAnthropic(
  b: AnthropicMessagesBody | AnthropicCountBody,
  model: string,
  opts: OpenAiOptions,
): Parsed {
  const { messages, sources } = openAiMessages(b.system, b.messages);
  const body: Record<string, unknown> = {
    model,
    messages,
    ...(b.tools
      ? {
        tools: b.tools.map((t) => ({
          type: "function",
          function: {
            name: t.name,
            ...(t.description !== undefined ? { description: t.description } : {}),
            parameters: t.input_schema,
          },
        })),
      }
      : {}),
    ...(b.tool_choice ? { tool_choice: toolChoice(b.tool_choice) } : {}),
  };
  if ("max_tokens" in b) {
    body.max_tokens = b.max_tokens;
    for (const f of ["temperature", "top_p", "top_k"] as const) {
      if (b[f] !== undefined) body[f] = b[f];
    }
    if (b.stop_sequences !== undefined) body.stop = b.stop_sequences;
    if (b.priority !== undefined) body.priority = b.priority;
    if (b.metadata !== undefined) body.metadata = b.metadata;
    const format = b.output_config?.format;
    if (format) {
      body.response_format = {
        type: "json_schema",
        json_schema: { name: "output", schema: format.schema },
      };
    }
  }
  return parseRespelled(body, "chat_completions", opts, RESPELL, {
    messages: sources,
    messageList: "messages",
    toolField: (f) => f.replace(/^\.parameters/, ".input_schema"),
  });
}
