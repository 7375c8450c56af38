import { Template } from "@huggingface/jinja";
import { protectLiteral } from "../tokenizer/literal_text.ts";
import { ChatRequestError } from "./chat_error.ts";

export type ChatRole = "system" | "developer" | "user" | "assistant" | "tool";

/** A call an assistant message made, its arguments parsed (templates write them with tojson). */
export interface ChatToolCall {
  readonly id: string;
  readonly name: string;
  readonly arguments: unknown;
}

export interface ChatTurn {
  readonly role: ChatRole;
  readonly content: string;
  /** An assistant turn's calls. */
  readonly toolCalls?: readonly ChatToolCall[];
  /** A tool turn: the call it answers, and the function's name when the client gave it. */
  readonly toolCallId?: string;
  readonly name?: string;
}

/** A tool as the template's `tools` variable holds it (OpenAI's shape). */
export interface ToolSpec {
  readonly type: "function";
  readonly function: {
    readonly name: string;
    readonly description?: string;
    readonly parameters?: Readonly<Record<string, unknown>>;
  };
}

/** Template variables a request adds (`chat_template_kwargs`), e.g. `{enable_thinking: false}`. */
export type TemplateVariables = Readonly<Record<string, unknown>>;

/**
 * Renders a conversation; `vars` reach the model's template beside `messages`, and `tools` (when
 * there are any) as its `tools` variable.
 */
export type ChatRenderer = (
  turns: readonly ChatTurn[],
  vars?: TemplateVariables | null,
  tools?: readonly ToolSpec[],
) => RenderedChat;

/** A chat rendered into prompt text, with stop strings the format needs. */
export interface RenderedChat {
  readonly prompt: string;
  readonly stop: readonly string[];
  /** Rendered by the model's template: its control-token text is meant as tokens. */
  readonly special: boolean;
}

/** Stops for the plain format: the model starting the next turn itself. */
export const PLAIN_CHAT_STOPS: readonly string[] = ["\nUser:", "\nSystem:"];

/**
 * The format used when the model carries no chat template: one line per message,
 * "System: ...", "User: ...", "Assistant: ..." ("developer" counts as System), then a final
 * "Assistant:" for the model to continue. Generation stops at "\nUser:" or "\nSystem:".
 *
 *   System: You are terse.
 *   User: Hi
 *   Assistant:
 */
export function renderPlainChat(
  turns: readonly ChatTurn[],
  vars?: TemplateVariables | null,
  tools?: readonly ToolSpec[],
): RenderedChat {
  refuseVariablesWithoutTemplate(vars);
  if ((tools?.length ?? 0) > 0 || turns.some((t) => t.role === "tool" || t.toolCalls)) {
    throw new ChatRequestError(
      "This model has no chat template, so it cannot render tools, tool calls or tool results",
      (tools?.length ?? 0) > 0 ? "tools" : "messages",
    );
  }
  const label = (r: ChatRole) => r === "assistant" ? "Assistant" : r === "user" ? "User" : "System";
  const lines = turns.map((t) => `${label(t.role)}: ${t.content}`);
  lines.push("Assistant:");
  return { prompt: lines.join("\n"), stop: PLAIN_CHAT_STOPS, special: false };
}

/** protectLiteral on every string in a JSON value (keys too: templates print whole objects). */
function protectStrings(v: unknown, specials: readonly string[]): unknown {
  if (typeof v === "string") return protectLiteral(v, specials);
  if (Array.isArray(v)) return v.map((x) => protectStrings(x, specials));
  if (typeof v === "object" && v !== null) {
    return Object.fromEntries(
      Object.entries(v).map(([k, x]) => [protectLiteral(k, specials), protectStrings(x, specials)]),
    );
  }
  return v;
}

// The plain format has no variables: accepting them would ignore a field that, on a model with
// a template, changes the prompt.
function refuseVariablesWithoutTemplate(vars: TemplateVariables | null | undefined): void {
  if (vars === undefined || vars === null || Object.keys(vars).length === 0) return;
  throw new ChatRequestError(
    `This model has no chat template, so template variables have no effect; received ${
      JSON.stringify(vars).slice(0, 200)
    }`,
    "chat_template_kwargs",
  );
}

/**
 * Builds the chat renderer for a model: its Jinja chat template (as in GGUF
 * `tokenizer.chat_template` / HF tokenizer_config.json) when it has one, else the plain format.
 * A template that fails to parse is reported at start-up, not on the first request. A request's
 * template variables (`chat_template_kwargs`) are passed to the template as Jinja variables,
 * as vLLM and llama-server do.
 *
 * The template's own text may spell special tokens (`specialTokens`: "<|im_start|>"), which
 * become tokens; the same spellings inside message content stay characters (see
 * lib/tokenizer/literal_text.ts), so a client cannot end a turn or open a system one.
 */
export function createChatRenderer(opts: {
  template?: string | undefined;
  bosToken: string;
  eosToken: string;
  specialTokens?: readonly string[];
}): ChatRenderer {
  const specials = opts.specialTokens ?? [];
  if (opts.template === undefined || opts.template.trim() === "") return renderPlainChat;
  let tpl: Template;
  try {
    tpl = new Template(opts.template);
  } catch (err) {
    throw new Error(
      `Cannot parse the model's chat template: ${err instanceof Error ? err.message : err}`,
    );
  }
  const protect = (v: unknown) => protectStrings(v, specials);
  return (turns, vars, tools) => {
    try {
      const prompt = tpl.render({
        // First, so that the server's own variables below always win.
        ...vars,
        messages: turns.map((t) => ({
          role: t.role,
          content: protectLiteral(t.content, specials),
          // Only where present: Llama 3.1's template tests `'tool_calls' in message`.
          ...(t.toolCalls
            ? {
              tool_calls: t.toolCalls.map((c) => ({
                id: protect(c.id),
                type: "function",
                function: { name: protect(c.name), arguments: protect(c.arguments) },
              })),
            }
            : {}),
          ...(t.toolCallId !== undefined ? { tool_call_id: protect(t.toolCallId) } : {}),
          ...(t.name !== undefined ? { name: protect(t.name) } : {}),
        })),
        // Only when there are tools: templates test `tools is defined` / `if tools`.
        ...(tools && tools.length > 0 ? { tools: protect(tools) } : {}),
        bos_token: opts.bosToken,
        eos_token: opts.eosToken,
        add_generation_prompt: true,
      });
      return { prompt, stop: [], special: true };
    } catch (err) {
      // Templates raise for conversations they do not support (e.g. roles not alternating).
      throw new ChatRequestError(
        `The model's chat template rejected these messages: ${
          err instanceof Error ? err.message : String(err)
        }`,
        "messages",
      );
    }
  };
}
