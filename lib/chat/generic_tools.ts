import type {
  ChatRenderer,
  ChatTurn,
  RenderedChat,
  TemplateVariables,
  ToolSpec,
} from "./chat_template.ts";
import { ChatRequestError } from "./chat_error.ts";

/**
 * The generic tool format: how a model whose chat template has no tool syntax (or that has no
 * template) still calls tools, as llama-server falls back to. The tools are described in the
 * system prompt; the answer is one JSON object `{"name": ..., "arguments": {...}}`, which the
 * grammar engine makes valid under the tool's parameters (tools.ts toolPlan); and a history's
 * calls and results become ordinary text turns, since the template renders no other kind.
 */

/** How a model is asked to call, at the end of the tool list. */
const HOW_TO_CALL = 'To call a tool, answer with only a JSON object: {"name": <tool name>, ' +
  '"arguments": <an object valid under that tool\'s parameters>}.';

/**
 * The system prompt's tool section: each tool's name, description and JSON Schema of its
 * arguments, then how to call. `must`: tool_choice "required" or a named function (then the
 * grammar forces a call anyway; saying so keeps the prompt honest).
 *
 * ```ts
 * import { assertStringIncludes } from "@std/assert";
 *
 * const text = genericToolPrompt([{ type: "function", function: { name: "now" } }], false);
 * assertStringIncludes(text, '- now\n  arguments: {"type":"object"}');
 * ```
 */
export function genericToolPrompt(tools: readonly ToolSpec[], must: boolean): string {
  const list = tools.map(({ function: f }) =>
    `- ${f.name}${f.description ? `: ${f.description}` : ""}\n  arguments: ${
      JSON.stringify(f.parameters ?? { type: "object" })
    }`
  );
  return [
    "You can call these tools:",
    ...list,
    must
      ? HOW_TO_CALL.replace("To call a tool, answer", "Answer")
      : `${HOW_TO_CALL} Otherwise answer in text.`,
  ].join("\n");
}

/**
 * A conversation's tool history as text turns: an assistant's calls become its text (one JSON
 * call a line, after any words), a tool's result a user turn "Tool result (name): ...", joined
 * with the user turns beside it so that templates which want roles to alternate still render.
 */
export function genericToolTurns(turns: readonly ChatTurn[]): ChatTurn[] {
  const names = new Map<string, string>();
  const out: ChatTurn[] = [];
  /** Whether out's last turn holds a tool result (only those are joined). */
  let joinable = false;
  for (const t of turns) {
    if (t.toolCalls) {
      for (const c of t.toolCalls) names.set(c.id, c.name);
      const calls = t.toolCalls.map((c) =>
        JSON.stringify({ name: c.name, arguments: c.arguments })
      );
      const content = [t.content, ...calls].filter((s) => s !== "").join("\n");
      out.push({ role: t.role, content });
      joinable = false;
      continue;
    }
    const tool = t.role === "tool";
    const content = tool
      ? `Tool result (${t.name ?? names.get(t.toolCallId ?? "") ?? "unknown"}): ${t.content}`
      : t.content;
    const last = out.at(-1);
    if (last?.role === "user" && (t.role === "user" || tool) && (joinable || tool)) {
      out[out.length - 1] = { role: "user", content: `${last.content}\n\n${content}` };
    } else {
      out.push({ role: tool ? "user" : t.role, content });
    }
    joinable = tool || (joinable && t.role === "user");
  }
  return out;
}

/**
 * Renders the turns with the tool section `preamble` in the system prompt: before the first
 * system (or developer) turn's text, or as a system turn of its own; where the template refuses
 * a system turn (some raise on any role but user and assistant), before the first user turn's.
 */
export function renderWithPreamble(
  render: ChatRenderer,
  turns: readonly ChatTurn[],
  vars: TemplateVariables | null | undefined,
  preamble: string,
): RenderedChat {
  const first = turns[0];
  if (first && (first.role === "system" || first.role === "developer")) {
    return render([prefixed(first, preamble), ...turns.slice(1)], vars);
  }
  try {
    return render([{ role: "system", content: preamble }, ...turns], vars);
  } catch (err) {
    const user = turns.findIndex((t) => t.role === "user");
    if (!(err instanceof ChatRequestError) || user < 0) throw err;
    const inUser = turns.map((t, i) => i === user ? prefixed(t, preamble) : t);
    try {
      return render(inUser, vars);
    } catch {
      throw err;
    }
  }
}

function prefixed(t: ChatTurn, preamble: string): ChatTurn {
  return { ...t, content: t.content === "" ? preamble : `${preamble}\n\n${t.content}` };
}
