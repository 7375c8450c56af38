import { Template } from "@huggingface/jinja";
import { protectLiteral } from "../tokenizer/literal_text.ts";
import { ApiError } from "./errors.ts";

export type ChatRole = "system" | "developer" | "user" | "assistant";

export interface ChatTurn {
  readonly role: ChatRole;
  readonly content: string;
}

/** Template variables a request adds (`chat_template_kwargs`), e.g. `{enable_thinking: false}`. */
export type TemplateVariables = Readonly<Record<string, unknown>>;

/** Renders a conversation; `vars` reach the model's template beside `messages`. */
export type ChatRenderer = (
  turns: readonly ChatTurn[],
  vars?: TemplateVariables | null,
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
): RenderedChat {
  refuseVariablesWithoutTemplate(vars);
  const label = (r: ChatRole) => r === "assistant" ? "Assistant" : r === "user" ? "User" : "System";
  const lines = turns.map((t) => `${label(t.role)}: ${t.content}`);
  lines.push("Assistant:");
  return { prompt: lines.join("\n"), stop: PLAIN_CHAT_STOPS, special: false };
}

// The plain format has no variables: accepting them would ignore a field that, on a model with
// a template, changes the prompt.
function refuseVariablesWithoutTemplate(vars: TemplateVariables | null | undefined): void {
  if (vars === undefined || vars === null || Object.keys(vars).length === 0) return;
  throw new ApiError(
    "invalid_request",
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
  return (turns, vars) => {
    try {
      const prompt = tpl.render({
        // First, so that the server's own variables below always win.
        ...vars,
        messages: turns.map((t) => ({
          role: t.role,
          content: protectLiteral(t.content, specials),
        })),
        bos_token: opts.bosToken,
        eos_token: opts.eosToken,
        add_generation_prompt: true,
      });
      return { prompt, stop: [], special: true };
    } catch (err) {
      // Templates raise for conversations they do not support (e.g. roles not alternating).
      throw new ApiError(
        "invalid_request",
        `The model's chat template rejected these messages: ${
          err instanceof Error ? err.message : String(err)
        }`,
        "messages",
      );
    }
  };
}
