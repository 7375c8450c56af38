import { z } from "zod";
import type { OutputConstraint } from "../grammar/output_constraint.ts";
import { unsupportedSchemaPart } from "../grammar/schema_support.ts";
import type {
  ChatRenderer,
  ChatToolCall,
  ChatTurn,
  RenderedChat,
  TemplateVariables,
  ToolSpec,
} from "./chat_template.ts";
import { ChatRequestError } from "./chat_error.ts";
import { genericToolPrompt, genericToolTurns, renderWithPreamble } from "./generic_tools.ts";
import type { ToolCallFormat } from "./tool_calls.ts";

/**
 * OpenAI's `tools` and `tool_choice` on chat completions: their shapes, the checks across them,
 * and what a request then does: which tools the chat template renders, which format the answer
 * is parsed in, and (for `required` or a named function) the output constraint that makes the
 * answer a call whose arguments validate against the function's `parameters`. A model whose
 * template has no tool syntax gets the generic format (generic_tools.ts) instead of a refusal.
 */

/** OpenAI's function names: letters, digits, underscores and dashes, at most 64. */
const FUNCTION_NAME = /^[A-Za-z0-9_.-]{1,64}$/;
const functionName = z.string().regex(FUNCTION_NAME, {
  error: "expected a function name of 1 to 64 letters, digits, '_', '.' or '-'",
});

export const FunctionTool = z.strictObject({
  type: z.literal("function", { error: 'only tools of type "function" are supported' }),
  function: z.strictObject({
    name: functionName,
    description: z.string().nullish(),
    parameters: z.record(z.string(), z.unknown(), {
      error: "expected a JSON Schema object",
    }).nullish(),
    strict: z.boolean().nullish(),
  }),
});
export type FunctionTool = z.output<typeof FunctionTool>;

export const ToolChoice = z.union([
  z.enum(["none", "auto", "required"]),
  z.strictObject({
    type: z.literal("function"),
    function: z.strictObject({ name: z.string() }),
  }),
], {
  error: 'expected "none", "auto", "required" or {type: "function", function: {name}}',
});
export type ToolChoice = z.output<typeof ToolChoice>;

/** An assistant message's call, as clients send it back. */
export const MessageToolCall = z.strictObject({
  id: z.string(),
  type: z.literal("function", { error: 'only tool calls of type "function" are supported' }),
  function: z.strictObject({
    name: z.string(),
    arguments: z.string(),
    // Added by the openai SDK's helpers to the calls they assemble; accepted back, unused.
    parsed_arguments: z.unknown().optional(),
  }),
  // A streamed call's position, kept by some clients' accumulators.
  index: z.number().int().min(0).nullish(),
});

/** What the chat template and the answer's parsing do for one request. */
export interface ToolPlan {
  /** Tools the template renders (none for tool_choice "none"). */
  readonly tools: readonly ToolSpec[];
  /** How the answer is read back into calls; undefined: it is plain content. */
  readonly parse?: ToolCallFormat;
  /**
   * For "required" or a named function: the answer is made a call. In the generic format, for
   * "auto" too: a call or text (json_schema_or_text).
   */
  readonly constraint?: OutputConstraint;
  /** The generic format: the tool section for the system prompt (generic_tools.ts). */
  readonly preamble?: string;
}

/** What a chat template does with tools, read from its text. */
export interface TemplateTools {
  /** The model has a chat template at all (else the plain format, which has no tools). */
  readonly template: boolean;
  /** The template reads `tools` at all. */
  readonly supported: boolean;
  /** The answer format it teaches: `<tool_call>` tags, else bare JSON (Llama 3.1). */
  readonly format: ToolCallFormat;
  /** The key of a call's arguments in that format. */
  readonly argumentsKey: "arguments" | "parameters";
}

/**
 * The tool format a model uses, as /props and /v1/models report it: "native:hermes" or
 * "native:json" where its template renders tools, else "generic".
 */
export function toolFormatName(t: TemplateTools): string {
  return t.supported ? `native:${t.format}` : "generic";
}

/**
 * Tool support of a template: it must read the `tools` variable (Llama 3.1, Qwen2.5 and Qwen3
 * do; Zephyr, TinyLlama's, does not). `<tool_call>` in it means the Hermes format.
 */
export function templateTools(template: string | undefined): TemplateTools {
  const t = template ?? "";
  const has = t.trim() !== "";
  const supported = has && /\btools\b/.test(t);
  if (t.includes("<tool_call>")) {
    return { template: has, supported, format: "hermes", argumentsKey: "arguments" };
  }
  const parameters = /"parameters"/.test(t) || t.includes("<|python_tag|>");
  return {
    template: has,
    supported,
    format: "json",
    argumentsKey: parameters ? "parameters" : "arguments",
  };
}

interface ToolFields {
  readonly tools?: readonly FunctionTool[] | null | undefined;
  readonly tool_choice?: ToolChoice | null | undefined;
}

const none: ToolPlan = { tools: [] };

/**
 * Checks tools and tool_choice together and plans the request, or throws a 400 naming the field:
 * tool_choice without tools, a named function that is not among them, two tools of one name, a
 * `parameters` that is not an object schema (or, when the call is constrained, one with a keyword
 * constrained decoding cannot enforce), or a second output constraint beside a constrained call
 * (in the generic format, beside any call).
 */
export function toolPlan(
  b: ToolFields,
  template: TemplateTools,
  otherConstraint: string | undefined,
): ToolPlan {
  const tools = b.tools ?? [];
  const choice = b.tool_choice ?? (tools.length > 0 ? "auto" : "none");
  if (tools.length === 0) {
    if (b.tool_choice !== undefined && b.tool_choice !== null && b.tool_choice !== "none") {
      throw new ChatRequestError(
        `Invalid 'tool_choice': ${JSON.stringify(b.tool_choice)} needs 'tools'; none were given`,
        "tool_choice",
      );
    }
    return none;
  }
  const seen = new Set<string>();
  tools.forEach((t, i) => {
    const name = t.function.name;
    if (seen.has(name)) {
      throw new ChatRequestError(
        `Invalid 'tools[${i}].function.name': two tools are named "${name}"`,
        `tools[${i}].function.name`,
      );
    }
    seen.add(name);
    checkParameters(t, i, false);
  });
  if (choice === "none") return none;
  const specs = tools.map(toolSpec);
  if (choice === "auto" && template.supported) return { tools: specs, parse: template.format };
  let chosen = tools;
  if (typeof choice === "object") {
    const named = tools.find((t) => t.function.name === choice.function.name);
    if (!named) {
      throw new ChatRequestError(
        `Invalid 'tool_choice.function.name': no tool is named ${
          JSON.stringify(choice.function.name)
        } (tools: ${tools.map((t) => JSON.stringify(t.function.name)).join(", ")})`,
        "tool_choice.function.name",
      );
    }
    chosen = [named];
  }
  if (otherConstraint !== undefined) {
    throw new ChatRequestError(
      `Invalid '${otherConstraint}': tool_choice ${JSON.stringify(choice)} already constrains ${
        choice === "auto"
          ? "the output to text or a call (this model's template has no tool syntax, so its " +
            "calls are constrained JSON)"
          : "the output to a call"
      }; give one output constraint`,
      otherConstraint,
    );
  }
  tools.forEach((t, i) => {
    if (chosen.includes(t)) checkParameters(t, i, true);
  });
  const argumentsKey = template.supported ? template.argumentsKey : "arguments";
  const calls = chosen.map((t) => callSchema(t, argumentsKey));
  const schema = JSON.stringify(calls.length === 1 ? calls[0]! : { anyOf: calls });
  if (!template.supported) {
    // The generic format: the template never sees the tools; the system prompt describes them.
    return {
      tools: [],
      parse: "generic",
      constraint: choice === "auto"
        ? { type: "json_schema_or_text", schema }
        : { type: "json_schema", schema },
      preamble: genericToolPrompt(specs, choice !== "auto"),
    };
  }
  // A constrained call is bare JSON, whatever the template's own format.
  return { tools: specs, parse: "json", constraint: { type: "json_schema", schema } };
}

/**
 * Renders a request's turns with its plan's tools: through the template's `tools`, or (the
 * generic format) as a section of the system prompt.
 */
export function renderChatTools(
  render: ChatRenderer,
  turns: readonly ChatTurn[],
  vars: TemplateVariables | null | undefined,
  plan: ToolPlan,
): RenderedChat {
  if (plan.preamble === undefined) return render(turns, vars, plan.tools);
  return renderWithPreamble(render, turns, vars, plan.preamble);
}

function checkParameters(t: FunctionTool, i: number, constrained: boolean): void {
  const p = t.function.parameters;
  if (p === undefined || p === null) return;
  const param = `tools[${i}].function.parameters`;
  if (p.type !== undefined && p.type !== "object") {
    throw new ChatRequestError(
      `Invalid '${param}.type': a function's parameters are a JSON object, so its schema's type ` +
        `must be "object"; got ${JSON.stringify(p.type)}`,
      `${param}.type`,
    );
  }
  if (!constrained) return;
  const problem = unsupportedSchemaPart(p);
  if (problem) {
    const at = problem.path === "" ? param : `${param}.${problem.path}`;
    throw new ChatRequestError(
      `Invalid '${at}': ${problem.message} (the call is constrained to these parameters)`,
      at,
    );
  }
}

/** The JSON schema of one call to `t`: its name, and arguments valid under its parameters. */
function callSchema(t: FunctionTool, argumentsKey: string): Record<string, unknown> {
  return {
    type: "object",
    properties: {
      name: { const: t.function.name },
      [argumentsKey]: t.function.parameters ?? { type: "object" },
    },
    required: ["name", argumentsKey],
    additionalProperties: false,
  };
}

/** A tool as templates read it (OpenAI's shape, which Hugging Face's templates expect). */
function toolSpec(t: FunctionTool): ToolSpec {
  const f = t.function;
  return {
    type: "function",
    function: {
      name: f.name,
      ...(f.description !== undefined && f.description !== null
        ? { description: f.description }
        : {}),
      ...(f.parameters !== undefined && f.parameters !== null ? { parameters: f.parameters } : {}),
    },
  };
}

/** A chat message as the request schema gives it (schemas.ts ChatMessage). */
export interface RequestMessage {
  readonly role: ChatTurn["role"];
  readonly content?: string | readonly { readonly text: string }[] | null | undefined;
  readonly name?: string | null | undefined;
  readonly tool_calls?: readonly z.output<typeof MessageToolCall>[] | null | undefined;
  readonly tool_call_id?: string | null | undefined;
  readonly refusal?: string | null | undefined;
}

/**
 * The turns a template renders, from the request's messages. Where the template has no tool
 * support, tool messages and assistant calls become text turns (generic_tools.ts); a call's
 * arguments must be JSON (templates write them back with `tojson`); content may be null only
 * beside calls.
 */
export function chatTurns(
  messages: readonly RequestMessage[],
  template: TemplateTools,
): ChatTurn[] {
  /** Ids of the calls of the assistant messages so far: what a tool message may answer. */
  const callIds = new Set<string>();
  const turns = messages.map((message, i): ChatTurn => {
    let m = message;
    const calls = m.tool_calls ?? [];
    if ((m.content === null || m.content === undefined) && m.role === "assistant" && m.refusal) {
      m = { ...m, content: m.refusal };
    }
    if (m.role !== "assistant" && m.tool_calls !== undefined && m.tool_calls !== null) {
      throw new ChatRequestError(
        `Invalid 'messages[${i}].tool_calls': only assistant messages carry tool calls`,
        `messages[${i}].tool_calls`,
      );
    }
    if (m.role === "tool" && !m.tool_call_id) {
      throw new ChatRequestError(
        `Missing 'messages[${i}].tool_call_id': a tool message answers the call of that id`,
        `messages[${i}].tool_call_id`,
      );
    }
    // OpenAI answers 400 too: a result for a call never made is a confused or forged history.
    if (m.role === "tool" && !callIds.has(m.tool_call_id!)) {
      throw new ChatRequestError(
        `Invalid 'messages[${i}].tool_call_id': no earlier assistant message has a tool call ` +
          `of id ${JSON.stringify(m.tool_call_id!.slice(0, 100))}` +
          (callIds.size === 0 ? " (none has tool_calls)" : ""),
        `messages[${i}].tool_call_id`,
      );
    }
    for (const c of calls) callIds.add(c.id);
    if (m.content === null || m.content === undefined) {
      if (!(m.role === "assistant" && calls.length > 0)) {
        throw new ChatRequestError(
          `Missing 'messages[${i}].content': only an assistant message with tool_calls may ` +
            "leave it null",
          `messages[${i}].content`,
        );
      }
    }
    const content = m.content === null || m.content === undefined
      ? ""
      : typeof m.content === "string"
      ? m.content
      : m.content.map((p) => p.text).join("");
    const toolCalls = calls.map((c, k): ChatToolCall => {
      let args: unknown;
      try {
        args = JSON.parse(c.function.arguments);
      } catch (e) {
        throw new ChatRequestError(
          `Invalid 'messages[${i}].tool_calls[${k}].function.arguments': not JSON (${
            (e as Error).message
          })`,
          `messages[${i}].tool_calls[${k}].function.arguments`,
        );
      }
      return { id: c.id, name: c.function.name, arguments: args };
    });
    return {
      role: m.role,
      content,
      ...(toolCalls.length > 0 ? { toolCalls } : {}),
      ...(m.role === "tool" && m.tool_call_id ? { toolCallId: m.tool_call_id } : {}),
      ...(m.role === "tool" && m.name ? { name: m.name } : {}),
    };
  });
  return template.supported ? turns : genericToolTurns(turns);
}

/** An id for a call the server parsed: "call_" and 24 random letters and digits (OpenAI's look). */
export function newToolCallId(): string {
  const abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const bytes = crypto.getRandomValues(new Uint8Array(24));
  return "call_" + Array.from(bytes, (b) => abc[b % abc.length]).join("");
}
