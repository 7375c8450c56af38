import type { GenerationEvent, Usage } from "../core/generation.ts";
import type { ParsedToolCall, StreamPiece, ToolCallFormat } from "../chat/tool_calls.ts";
import type { ApiError } from "./errors.ts";
import { anthropicError } from "./error_shapes.ts";
import { AnswerEvents } from "./answer_events.ts";
import type { ServiceMetrics } from "./service_metrics.ts";
import { sseEvent } from "./sse.ts";

/** Anthropic's shapes of an answer: the message's blocks, usage, stop reason, stream events. */

type Done = Extract<GenerationEvent, { type: "done" }>;

/** A tool_use block's id: "toolu_" and 24 random letters and digits (Anthropic's look). */
function toolUseId(): string {
  const abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const bytes = crypto.getRandomValues(new Uint8Array(24));
  return "toolu_" + Array.from(bytes, (b) => abc[b % abc.length]).join("");
}

/** A parsed call as a tool_use block (the arguments' JSON as its input object). */
export function toolUse(c: ParsedToolCall) {
  return { type: "tool_use", id: toolUseId(), name: c.name, input: JSON.parse(c.arguments) };
}

/**
 * Anthropic's usage: input_tokens are the prompt tokens not read from the prefix cache, which
 * are cache_read_input_tokens (the three add up to the prompt, as in Anthropic's accounting).
 */
export function usage(u: Usage) {
  return {
    input_tokens: u.promptTokens - u.cachedTokens,
    cache_creation_input_tokens: 0,
    cache_read_input_tokens: u.cachedTokens,
    output_tokens: u.completionTokens,
  };
}

/** Why it ended, in Anthropic's words, and the client's stop sequence that ended it. */
export function stopReason(ev: Done, calls: number, stops: readonly string[]) {
  if (ev.finishReason === "length") return { stop_reason: "max_tokens", stop_sequence: null };
  if (calls > 0) return { stop_reason: "tool_use", stop_sequence: null };
  // A template's own stop string (the plain chat format's) is the end of the turn.
  if (ev.stopString !== undefined && stops.includes(ev.stopString)) {
    return { stop_reason: "stop_sequence", stop_sequence: ev.stopString };
  }
  return { stop_reason: "end_turn", stop_sequence: null };
}

/** The fields of the message object every answer starts with. */
export interface MessageHead {
  readonly id: string;
  readonly type: "message";
  readonly role: "assistant";
  readonly model: string;
}

/**
 * One streamed answer as Anthropic's events: message_start; a text block opened at the first
 * text and closed before a call or at the end; each call one tool_use block with its whole
 * input in one input_json_delta; message_delta with the stop reason and usage; message_stop.
 */
export class MessageEvents extends AnswerEvents {
  /** The last block's index, and whether it is an open text block. */
  #block = -1;
  #textOpen = false;
  #callCount = 0;

  constructor(
    readonly head: MessageHead,
    toolFormat: ToolCallFormat | undefined,
    readonly stops: readonly string[],
    metrics: ServiceMetrics,
  ) {
    super(toolFormat, metrics);
  }

  protected started(promptTokens: number): string[] {
    const u = usage({ promptTokens, completionTokens: 0, cachedTokens: 0 });
    const message = { ...this.head, content: [], stop_reason: null, stop_sequence: null };
    return [
      sseEvent("message_start", { type: "message_start", message: { ...message, usage: u } }),
    ];
  }

  protected finished(ev: Extract<GenerationEvent, { type: "done" }>, out: string[]): void {
    this.#closeText(out);
    out.push(
      sseEvent("message_delta", {
        type: "message_delta",
        delta: stopReason(ev, this.#callCount, this.stops),
        usage: usage(ev.usage),
      }),
      sseEvent("message_stop", { type: "message_stop" }),
    );
  }

  protected errorEvent(err: ApiError): string {
    return sseEvent("error", anthropicError(err));
  }

  #closeText(out: string[]): void {
    if (!this.#textOpen) return;
    out.push(sseEvent("content_block_stop", { type: "content_block_stop", index: this.#block }));
    this.#textOpen = false;
  }

  protected pieces(p: StreamPiece): string[] {
    const out: string[] = [];
    if (p.content !== "") {
      if (!this.#textOpen) {
        this.#textOpen = true;
        out.push(sseEvent("content_block_start", {
          type: "content_block_start",
          index: ++this.#block,
          content_block: { type: "text", text: "" },
        }));
      }
      out.push(sseEvent("content_block_delta", {
        type: "content_block_delta",
        index: this.#block,
        delta: { type: "text_delta", text: p.content },
      }));
    }
    for (const c of p.calls) {
      this.#closeText(out);
      const index = ++this.#block;
      this.#callCount++;
      out.push(
        sseEvent("content_block_start", {
          type: "content_block_start",
          index,
          content_block: { ...toolUse(c), input: {} },
        }),
        sseEvent("content_block_delta", {
          type: "content_block_delta",
          index,
          delta: { type: "input_json_delta", partial_json: c.arguments },
        }),
        sseEvent("content_block_stop", { type: "content_block_stop", index }),
      );
    }
    return out;
  }
}
