import { ApiError, toApiError } from "./errors.ts";
import { type OpenAiOptions, parse, type Parsed } from "./openai_routes.ts";

/** OpenAI parameter -> the field of another API it came from, most specific first. */
export type Respelling = readonly (readonly [string, string])[];

/** Where a chat request's messages and tools stand in the request the client sent. */
export interface ChatSources {
  /** The client's path of each chat message, by index. */
  readonly messages: readonly string[];
  /** The client's name for the message list, for a message with no path of its own. */
  readonly messageList: string;
  /** A tool's field in the client's names, from the path after `tools[i]` (or `.function`). */
  readonly toolField: (rest: string) => string;
}

/** The OpenAI parser's reading of another API's request, its errors in that API's names. */
export function parseRespelled(
  body: unknown,
  kind: Parameters<typeof parse>[1],
  opts: OpenAiOptions,
  table: Respelling,
  chat?: ChatSources,
): Parsed {
  try {
    return parse(body, kind, opts);
  } catch (e) {
    throw respelledError(e, table, chat);
  }
}

/**
 * An OpenAI-parser error in the names of the request it came from (Anthropic's, Ollama's, the
 * Responses API's), so the client reads the field it sent. A message's or a tool's path is
 * spelled by `chat`; the rest go by the first row of `table` the path starts with. The message
 * quotes the new name wherever it quoted the old one.
 */
function respelledError(err: unknown, table: Respelling, chat?: ChatSources): unknown {
  const e = toApiError(err);
  const p = e.param;
  if (p === null) return e;
  let param = chat && chatParam(p, chat);
  for (const [from, to] of table) {
    if (
      param === undefined && (p === from || p.startsWith(from + ".") || p.startsWith(from + "["))
    ) {
      param = to + p.slice(from.length);
    }
  }
  if (param === undefined || param === p) return e;
  return new ApiError(e.code, e.message.replaceAll(`'${p}'`, `'${param}'`), param);
}

function chatParam(p: string, chat: ChatSources): string | undefined {
  const msg = /^messages\[(\d+)\]/.exec(p);
  if (msg) return chat.messages[Number(msg[1])] ?? chat.messageList;
  const tool = /^tools\[(\d+)\](?:\.function)?(.*)$/.exec(p);
  if (tool) return `tools[${tool[1]}]${chat.toolField(tool[2]!)}`;
  return undefined;
}
