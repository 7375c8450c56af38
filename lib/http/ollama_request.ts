import { ApiError } from "./errors.ts";
import { parseRespelled, type Respelling } from "./respelled_error.ts";
import type { OpenAiOptions, Parsed } from "./openai_routes.ts";
import type {
  OllamaChatBody,
  OllamaGenerateBody,
  OllamaMessage,
  OllamaOptions,
} from "./ollama_schema.ts";

/**
 * Ollama's requests as OpenAI bodies: /api/chat as a chat completion, /api/generate as a chat
 * completion of one user turn (or, with raw: true, as a completion of the prompt as given).
 * The OpenAI parser (openai_routes.ts parse) then checks them, so the limits, the defaults and
 * the errors are the OpenAI routes' own; an error is respelled with the Ollama field the
 * client sent (`options.num_predict` for max_tokens).
 */

/** The options copied under the same name onto the OpenAI body. */
const SAME_NAME = [
  "temperature",
  "top_k",
  "top_p",
  "min_p",
  "seed",
  "stop",
  "repeat_penalty",
  "repeat_last_n",
  "presence_penalty",
  "frequency_penalty",
  "typical_p",
  "tfs_z",
  "mirostat",
  "mirostat_tau",
  "mirostat_eta",
] as const;

/** OpenAI parameter -> the Ollama field it came from, most specific first. */
const RESPELL: Respelling = [
  ["response_format.json_schema.schema", "format"],
  ["response_format", "format"],
  ["max_tokens", "options.num_predict"],
  ["penalize_nl", "options.penalize_newline"],
  ...SAME_NAME.map((n) => [n, `options.${n}`] as const),
];

/**
 * The served name an Ollama model name stands for: itself, or without Ollama's default tag
 * (`stories260K:latest` is `stories260K`). An unknown name is left for the parser to refuse.
 */
export function servedOllamaName(asked: string, served: readonly string[]): string {
  if (served.includes(asked)) return asked;
  const bare = asked.endsWith(":latest") ? asked.slice(0, -":latest".length) : asked;
  return served.includes(bare) ? bare : asked;
}

/** The OpenAI body's fields for Ollama's options and format. */
function sampling(o: OllamaOptions | null | undefined, format: OllamaChatBody["format"]) {
  const out: Record<string, unknown> = {};
  for (const name of SAME_NAME) if (o?.[name] !== undefined) out[name] = o[name];
  if (o?.penalize_newline !== undefined) out.penalize_nl = o.penalize_newline;
  // Ollama's -1 is "no limit" and -2 "until the context is full": both are the room left.
  if (o?.num_predict !== undefined && o.num_predict !== -1 && o.num_predict !== -2) {
    out.max_tokens = o.num_predict;
  }
  if (format === "json") out.response_format = { type: "json_object" };
  else if (typeof format === "object" && format !== null) {
    out.response_format = { type: "json_schema", json_schema: { name: "format", schema: format } };
  }
  return out;
}

/**
 * Ollama's messages as OpenAI's: a call's arguments object as JSON text with an id, and a tool
 * message as the answer to the earliest unanswered call (of its `tool_name`, when given), since
 * Ollama's messages carry no call ids.
 */
function openAiMessages(messages: readonly OllamaMessage[]): Record<string, unknown>[] {
  const open: { id: string; name: string }[] = [];
  return messages.map((m, i) => {
    const calls = m.tool_calls?.map((c, k) => ({
      id: c.id ?? `call_${i}_${k}`,
      type: "function",
      function: { name: c.function.name, arguments: JSON.stringify(c.function.arguments) },
    }));
    if (m.role === "tool") {
      const at = m.tool_name === undefined ? 0 : open.findIndex((c) => c.name === m.tool_name);
      if (open.length === 0 || at < 0) {
        throw new ApiError(
          "invalid_request",
          `Invalid 'messages[${i}]': a tool message answers an earlier assistant message's ` +
            `tool call${
              m.tool_name === undefined ? "" : ` to ${JSON.stringify(m.tool_name)}`
            }, and none is left unanswered`,
          `messages[${i}]`,
        );
      }
      const [call] = open.splice(at, 1);
      return { role: "tool", content: m.content ?? "", tool_call_id: call!.id, name: call!.name };
    }
    for (const c of calls ?? []) open.push({ id: c.id, name: c.function.name });
    return {
      role: m.role,
      content: m.content ?? "",
      ...(calls !== undefined ? { tool_calls: calls } : {}),
    };
  });
}

/** The context a request may use: the model's, or less with options.num_ctx (never more). */
export function requestContext(o: OllamaOptions | null | undefined, model: number): number {
  const asked = o?.num_ctx;
  if (asked === undefined) return model;
  if (asked > model) {
    throw new ApiError(
      "invalid_request",
      `Invalid 'options.num_ctx': the model's context is ${model} tokens (as the server was ` +
        `started); send at most ${model}, or leave it out; got ${asked}`,
      "options.num_ctx",
    );
  }
  return asked;
}

function parsed(
  body: Record<string, unknown>,
  kind: "chat_completions" | "completions",
  opts: OpenAiOptions,
  extra: Respelling = [],
): Parsed {
  const p = parseRespelled(body, kind, opts, [...extra, ...RESPELL]);
  // Ollama's num_predict defaults to -1: until a stop or the context's end, for both routes.
  return { ...p, input: { ...p.input, defaultMaxTokens: undefined } };
}

/** /api/chat as the OpenAI chat request. */
export function parseOllamaChat(b: OllamaChatBody, model: string, opts: OpenAiOptions): Parsed {
  return parsed(
    {
      model,
      messages: openAiMessages(b.messages ?? []),
      ...(b.tools ? { tools: b.tools } : {}),
      ...sampling(b.options, b.format),
    },
    "chat_completions",
    opts,
  );
}

/** /api/generate as the OpenAI request: one user turn (after `system`), or raw text. */
export function parseOllamaGenerate(
  b: OllamaGenerateBody,
  model: string,
  opts: OpenAiOptions,
): Parsed {
  const prompt = b.prompt ?? "";
  if (b.raw === true) {
    if (b.system) {
      throw new ApiError(
        "invalid_request",
        "Invalid 'system': a raw prompt is sent as it is, without the chat template that " +
          "would place the system prompt; put it in the prompt, or leave raw out",
        "system",
      );
    }
    return parsed({ model, prompt, ...sampling(b.options, b.format) }, "completions", opts);
  }
  const messages = [
    ...(b.system ? [{ role: "system", content: b.system }] : []),
    { role: "user", content: prompt },
  ];
  return parsed(
    { model, messages, ...sampling(b.options, b.format) },
    "chat_completions",
    opts,
    [["messages", "prompt"]],
  );
}
