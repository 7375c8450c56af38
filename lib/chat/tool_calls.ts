/**
 * Tool calls in a model's text: the formats the chat templates teach, read back into calls.
 *
 * - `hermes` (Qwen2.5, Qwen3, Hermes): each call is a JSON object between `<tool_call>` and
 *   `</tool_call>`, `{"name": ..., "arguments": {...}}`; text around the tags is content.
 * - `json` (Llama 3.1/3.2 Instruct): the whole answer is the JSON object
 *   `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`, or several of them
 *   separated by ";". It is also the shape constrained decoding produces (tools.ts), for every
 *   template.
 * - `generic` (models whose template has no tool syntax, generic_tools.ts): the whole answer is
 *   one `{"name": ..., "arguments": {...}}` object, nothing else (no tag, no list): exactly what
 *   its grammar lets through as a call.
 *
 * A call's arguments may be under "arguments" or "parameters" in either format; they must be a
 * JSON object, and come back as its JSON text (OpenAI's `function.arguments` is a string). Text
 * that is not a call stays content, so parsing never loses the model's words.
 *
 * The streaming parser (ToolCallStream) gives the same calls and, joined, the same content as
 * parseToolCalls on the whole text; it holds back only what may still turn out to be a call.
 */

export type ToolCallFormat = "hermes" | "json" | "generic";

export interface ParsedToolCall {
  readonly name: string;
  /** The arguments' JSON text (an object). */
  readonly arguments: string;
}

export interface ParsedOutput {
  /** The text that is not a call; null when it is only whitespace and there are calls. */
  readonly content: string | null;
  readonly calls: readonly ParsedToolCall[];
}

const OPEN = "<tool_call>";
const CLOSE = "</tool_call>";
const PYTHON_TAG = "<|python_tag|>";

/** One call from its JSON text, or undefined when the text is not one. */
export function parseCallJson(text: string): ParsedToolCall | undefined {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) return undefined;
  const o = v as Record<string, unknown>;
  if (typeof o.name !== "string" || o.name === "") return undefined;
  const args = "arguments" in o ? o.arguments : o.parameters;
  // Some models write the arguments as a JSON string; it must still hold an object.
  let obj: unknown = args === undefined ? {} : args;
  if (typeof obj === "string") {
    try {
      obj = JSON.parse(obj);
    } catch {
      return undefined;
    }
  }
  if (typeof obj !== "object" || obj === null || Array.isArray(obj)) return undefined;
  const keys = Object.keys(o).filter((k) =>
    k !== "name" && k !== "arguments" && k !== "parameters"
  );
  if (keys.length > 0) return undefined;
  return { name: o.name, arguments: JSON.stringify(obj) };
}

/**
 * A call that `max_tokens` cut short: `{"name": "f", "arguments": {"city": "Par` gives the name
 * and the arguments' text as generated so far, which is what OpenAI returns for a cut call
 * (with finish_reason "length"). Undefined when the text does not start like a call.
 */
export function cutCall(text: string): ParsedToolCall | undefined {
  const m = /^\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)("?)/s.exec(text);
  // Cut before the name began: a call all the same, with nothing of it generated yet.
  if (!m) return CALL_OPENING.startsWith(text.replace(/\s+/g, "")) ? EMPTY_CALL : undefined;
  const name = unescapeJson(m[1]!);
  if (m[2] === "") return { name, arguments: "" };
  const rest = text.slice(m[0].length);
  const args = /^\s*,\s*"(?:arguments|parameters)"\s*:\s*/s.exec(rest);
  return { name, arguments: args ? rest.slice(args[0].length) : "" };
}

const CALL_OPENING = '{"name":"';
const EMPTY_CALL: ParsedToolCall = { name: "", arguments: "" };

/** A JSON string's body read as far as it is whole (a cut escape is dropped). */
function unescapeJson(body: string): string {
  for (let end = body.length; end >= 0; end--) {
    try {
      return JSON.parse(`"${body.slice(0, end)}"`);
    } catch {
      // A cut `\u00` escape: try without its tail.
    }
  }
  return "";
}

/**
 * The calls of a bare-JSON answer ("json" or "generic" format), or undefined when it is not only
 * calls.
 */
function parseJsonCalls(text: string, format: ToolCallFormat): ParsedToolCall[] | undefined {
  const body = callBody(text, format);
  if (!body.startsWith("{")) return undefined;
  const one = parseCallJson(body);
  if (one) return [one];
  if (format === "generic") return undefined;
  // Llama 3.1 may give several calls separated by ";".
  const calls: ParsedToolCall[] = [];
  for (const part of body.split(/;\s*(?=\{)/)) {
    const c = parseCallJson(part.trim().replace(/;$/, ""));
    if (!c) return undefined;
    calls.push(c);
  }
  return calls.length > 1 ? calls : undefined;
}

/**
 * The answer without leading whitespace and ("json" only) without Llama 3.1's `<|python_tag|>`
 * lead.
 */
function callBody(text: string, format: ToolCallFormat): string {
  const body = text.trimStart();
  if (format !== "json") return body;
  return body.startsWith(PYTHON_TAG) ? body.slice(PYTHON_TAG.length).trimStart() : body;
}

/**
 * The calls in a finished text, and the content around them. With `cut` (the answer ended at
 * max_tokens), a call still open at the end is a call cut short (cutCall), not content.
 *
 * ```ts
 * parseToolCalls('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', "hermes");
 * // { content: null, calls: [{ name: "f", arguments: '{"x":1}' }] }
 * ```
 */
export function parseToolCalls(text: string, format: ToolCallFormat, cut = false): ParsedOutput {
  if (format !== "hermes") {
    const calls = parseJsonCalls(text, format);
    if (calls) return { content: null, calls };
    const partial = cut ? cutCall(callBody(text, format)) : undefined;
    return partial ? { content: null, calls: [partial] } : { content: text, calls: [] };
  }
  const calls: ParsedToolCall[] = [];
  let content = "";
  let at = 0;
  while (at < text.length) {
    const open = text.indexOf(OPEN, at);
    if (open < 0) break;
    const close = text.indexOf(CLOSE, open + OPEN.length);
    const end = close < 0 ? text.length : close + CLOSE.length;
    const body = text.slice(open + OPEN.length, close < 0 ? text.length : close);
    const call = parseCallJson(body.trim()) ??
      (cut && close < 0 ? cutCall(body.trim()) : undefined);
    content += text.slice(at, open);
    // A block that does not hold a call stays text, tags and all.
    if (call) calls.push(call);
    else content += text.slice(open, end);
    at = end;
  }
  content += text.slice(at);
  if (calls.length === 0) return { content: text, calls: [] };
  const kept = content.trimEnd();
  return { content: kept.trim() === "" ? null : kept, calls };
}

/** What one push of text gives a stream: content to send now, calls completed now. */
export interface StreamPiece {
  readonly content: string;
  readonly calls: readonly ParsedToolCall[];
}

/**
 * Parses a streamed answer piece by piece. Content goes out as soon as it cannot be part of a
 * call; whitespace waits for the next words (so a call alone sends no content); a hermes call
 * goes out when its `</tool_call>` arrives; a "json" answer that starts with "{" is held to the
 * end, when it either is calls or goes out as content.
 */
export class ToolCallStream {
  #format: ToolCallFormat;
  /** Text not yet decided. */
  #held = "";
  /** Inside a hermes `<tool_call>` block (its text after the tag is in #held). */
  #inCall = false;
  /** "json": the answer does not start like a call, so everything is content. */
  #plain = false;
  /** Whitespace sent only once more content follows. */
  #space = "";
  #calls = 0;

  constructor(format: ToolCallFormat) {
    this.#format = format;
  }

  push(text: string): StreamPiece {
    this.#held += text;
    return this.#format === "hermes" ? this.#pushHermes(false) : this.#pushJson();
  }

  /** The end of the answer (`cut`: at max_tokens): what was held is decided now. */
  finish(cut = false): StreamPiece {
    if (this.#format !== "hermes") {
      if (this.#plain) return this.#content(this.#takeHeld(), true);
      const all = this.#takeHeld();
      const calls = parseJsonCalls(all, this.#format);
      if (calls) return { content: "", calls };
      const partial = cut ? cutCall(callBody(all, this.#format)) : undefined;
      if (partial) return { content: "", calls: [partial] };
      return { content: all, calls: [] };
    }
    return this.#pushHermes(true, cut);
  }

  #takeHeld(): string {
    const h = this.#held;
    this.#held = "";
    return h;
  }

  #pushJson(): StreamPiece {
    if (this.#plain) return this.#content(this.#takeHeld(), false);
    const lead = this.#held.trimStart();
    if (lead === "") return { content: "", calls: [] };
    const startsLikeCall = lead.startsWith("{") ||
      (this.#format === "json" && (lead.startsWith(PYTHON_TAG) || PYTHON_TAG.startsWith(lead)));
    if (startsLikeCall) return { content: "", calls: [] };
    this.#plain = true;
    return this.#content(this.#takeHeld(), false);
  }

  #pushHermes(end: boolean, cut = false): StreamPiece {
    let content = "";
    const calls: ParsedToolCall[] = [];
    for (;;) {
      if (this.#inCall) {
        const close = this.#held.indexOf(CLOSE);
        if (close < 0 && !end) break;
        const body = close < 0 ? this.#held : this.#held.slice(0, close);
        const rest = close < 0 ? "" : this.#held.slice(close + CLOSE.length);
        const call = parseCallJson(body.trim()) ??
          (cut && close < 0 ? cutCall(body.trim()) : undefined);
        if (call) {
          calls.push(call);
          this.#calls++;
        } else {
          content += this.#emit(OPEN + body + (close < 0 ? "" : CLOSE));
        }
        this.#held = rest;
        this.#inCall = false;
        continue;
      }
      const open = this.#held.indexOf(OPEN);
      if (open >= 0) {
        content += this.#emit(this.#held.slice(0, open));
        this.#held = this.#held.slice(open + OPEN.length);
        this.#inCall = true;
        continue;
      }
      // Keep back a tail that may be the start of "<tool_call>".
      const keep = end ? 0 : partialTagLength(this.#held, OPEN);
      content += this.#emit(this.#held.slice(0, this.#held.length - keep));
      this.#held = this.#held.slice(this.#held.length - keep);
      break;
    }
    // Trailing whitespace is content only when no call came (parseToolCalls trims it then).
    if (end && this.#calls === 0 && calls.length === 0) {
      content += this.#space;
      this.#space = "";
    }
    return { content, calls };
  }

  /** Text that is content: whitespace waits, other text goes out with the whitespace before it. */
  #emit(text: string): string {
    if (text === "") return "";
    const body = text.trimEnd();
    if (body === "") {
      this.#space += text;
      return "";
    }
    const out = this.#space + body;
    this.#space = text.slice(body.length);
    return out;
  }

  #content(text: string, end: boolean): StreamPiece {
    if (end) {
      const out = this.#space + text;
      this.#space = "";
      return { content: out, calls: [] };
    }
    return { content: this.#emit(text), calls: [] };
  }
}

/** Length of the longest tail of `text` that is a proper prefix of `tag`. */
function partialTagLength(text: string, tag: string): number {
  for (let n = Math.min(tag.length - 1, text.length); n > 0; n--) {
    if (tag.startsWith(text.slice(text.length - n))) return n;
  }
  return 0;
}
