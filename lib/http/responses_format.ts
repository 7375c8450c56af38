import type { GenerationEvent, Usage } from "../core/generation.ts";
import { newToolCallId } from "../chat/tools.ts";
import type { ParsedToolCall, StreamPiece, ToolCallFormat } from "../chat/tool_calls.ts";
import type { ApiError } from "./errors.ts";
import { AnswerEvents } from "./answer_events.ts";
import type { ServiceMetrics } from "./service_metrics.ts";
import { sseEvent } from "./sse.ts";

/** OpenAI's Responses shapes of an answer: the response object, its output items, the events. */

type Done = Extract<GenerationEvent, { type: "done" }>;

/** An item id: a prefix and 24 random hex digits (OpenAI's look). */
function itemId(prefix: string): string {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** The Responses usage: the prompt (with the part read from the prefix cache) and the output. */
export function responsesUsage(u: Usage) {
  return {
    input_tokens: u.promptTokens,
    input_tokens_details: { cached_tokens: u.cachedTokens },
    output_tokens: u.completionTokens,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: u.promptTokens + u.completionTokens,
  };
}

/** The response fields that echo the request, set before the answer is known. */
export type ResponseHead = Record<string, unknown> & { readonly id: string };

/** Cut by max_output_tokens: "incomplete", saying why; else "completed". */
function ending(done: Done) {
  return done.finishReason === "length"
    ? { status: "incomplete", incomplete_details: { reason: "max_output_tokens" } }
    : { status: "completed", incomplete_details: null };
}

/** The response object: its head, the output items, and how it ended (null: still running). */
export function responseObject(head: ResponseHead, output: unknown[], done: Done | null) {
  return {
    ...head,
    ...(done ? ending(done) : { status: "in_progress", incomplete_details: null }),
    output,
    usage: done ? responsesUsage(done.usage) : null,
  };
}

export function messageItem(id: string, text: string, status: string) {
  const content = status === "in_progress" ? [] : [outputText(text)];
  return { type: "message", id, status, role: "assistant", content };
}

function outputText(text: string) {
  return { type: "output_text", text, annotations: [], logprobs: [] };
}

export function functionCallItem(id: string, c: ParsedToolCall, status: string) {
  return {
    type: "function_call",
    id,
    call_id: newToolCallId(),
    name: c.name,
    arguments: status === "in_progress" ? "" : c.arguments,
    status,
  };
}

/** A whole answer's output items: its text as a message (when there are no calls), its calls. */
export function outputItems(content: string, calls: readonly ParsedToolCall[]) {
  return [
    ...(content !== "" || calls.length === 0
      ? [messageItem(itemId("msg_"), content, "completed")]
      : []),
    ...calls.map((c) => functionCallItem(itemId("fc_"), c, "completed")),
  ];
}

/**
 * One streamed answer as the Responses events, each with its sequence_number:
 * response.created and response.in_progress; the text as one message item (output_item.added,
 * content_part.added, output_text.delta per piece, then output_text.done, content_part.done,
 * output_item.done), closed before a call; each call one function_call item with its whole
 * arguments in one function_call_arguments.delta, then .done; response.completed (or
 * response.incomplete when max_output_tokens cut it) with the whole response.
 */
export class ResponseEvents extends AnswerEvents {
  readonly #output: Record<string, unknown>[] = [];
  #seq = 0;
  /** The open message item: its id, index and text so far. */
  #message: { id: string; index: number; text: string } | undefined;

  constructor(
    readonly head: ResponseHead,
    toolFormat: ToolCallFormat | undefined,
    metrics: ServiceMetrics,
  ) {
    super(toolFormat, metrics);
  }

  #event(type: string, fields: Record<string, unknown>): string {
    return sseEvent(type, { type, sequence_number: this.#seq++, ...fields });
  }

  protected started(): string[] {
    const response = responseObject(this.head, [], null);
    return [
      this.#event("response.created", { response }),
      this.#event("response.in_progress", { response }),
    ];
  }

  protected finished(ev: Extract<GenerationEvent, { type: "done" }>, out: string[]): void {
    // An answer with neither text nor calls is still one (empty) message.
    if (this.#output.length === 0 && this.#message === undefined) {
      out.push(...this.pieces({ content: "", calls: [] }, true));
    }
    this.#closeMessage(out);
    const response = responseObject(this.head, this.#output, ev);
    const type = response.status === "completed" ? "response.completed" : "response.incomplete";
    out.push(this.#event(type, { response }));
  }

  protected errorEvent(err: ApiError): string {
    const { message, code, param } = err.toJSON().error;
    return this.#event("error", { code, message, param });
  }

  #closeMessage(out: string[]): void {
    const m = this.#message;
    if (m === undefined) return;
    const at = { item_id: m.id, output_index: m.index, content_index: 0 };
    const item = messageItem(m.id, m.text, "completed");
    this.#output.push(item);
    out.push(
      this.#event("response.output_text.done", { ...at, text: m.text, logprobs: [] }),
      this.#event("response.content_part.done", { ...at, part: outputText(m.text) }),
      this.#event("response.output_item.done", { output_index: m.index, item }),
    );
    this.#message = undefined;
  }

  protected pieces(p: StreamPiece, open = false): string[] {
    const out: string[] = [];
    if (p.content !== "" || open) {
      if (this.#message === undefined) {
        const m = { id: itemId("msg_"), index: this.#output.length, text: "" };
        this.#message = m;
        out.push(
          this.#event("response.output_item.added", {
            output_index: m.index,
            item: messageItem(m.id, "", "in_progress"),
          }),
          this.#event("response.content_part.added", {
            item_id: m.id,
            output_index: m.index,
            content_index: 0,
            part: outputText(""),
          }),
        );
      }
      const m = this.#message;
      if (p.content !== "") {
        m.text += p.content;
        out.push(this.#event("response.output_text.delta", {
          item_id: m.id,
          output_index: m.index,
          content_index: 0,
          delta: p.content,
          logprobs: [],
        }));
      }
    }
    for (const c of p.calls) {
      this.#closeMessage(out);
      const index = this.#output.length;
      const item = functionCallItem(itemId("fc_"), c, "completed");
      this.#output.push(item);
      const at = { item_id: item.id, output_index: index };
      out.push(
        this.#event("response.output_item.added", {
          output_index: index,
          item: { ...item, arguments: "", status: "in_progress" },
        }),
        this.#event("response.function_call_arguments.delta", { ...at, delta: c.arguments }),
        this.#event("response.function_call_arguments.done", {
          ...at,
          name: c.name,
          arguments: c.arguments,
        }),
        this.#event("response.output_item.done", { output_index: index, item }),
      );
    }
    return out;
  }
}
