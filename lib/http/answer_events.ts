import type { GenerationEvent } from "../core/generation.ts";
import { type StreamPiece, type ToolCallFormat, ToolCallStream } from "../chat/tool_calls.ts";
import { type ApiError, fromGenerationError } from "./errors.ts";
import { serverCut } from "./generation_run.ts";
import type { ServiceMetrics } from "./service_metrics.ts";

/**
 * One streamed answer as another API's events (Anthropic's Messages, the Responses API): the
 * text and the calls parsed from it (where the request has a tool-call format) go out as the
 * subclass spells them; a cut or a failed generation ends the stream with one error event,
 * counted in the errors metric.
 */
export abstract class AnswerEvents {
  readonly #calls: ToolCallStream | undefined;

  constructor(toolFormat: ToolCallFormat | undefined, readonly metrics: ServiceMetrics) {
    this.#calls = toolFormat ? new ToolCallStream(toolFormat) : undefined;
  }

  /** The events that open the answer. */
  protected abstract started(promptTokens: number): string[];
  /** The events of a piece of text and the calls finished with it. */
  protected abstract pieces(p: StreamPiece): string[];
  /** Appends the events that close the answer to `out`. */
  protected abstract finished(ev: Extract<GenerationEvent, { type: "done" }>, out: string[]): void;
  /** The one event that ends a failed answer. */
  protected abstract errorEvent(err: ApiError): string;

  render(ev: GenerationEvent): { chunks: string[]; last: boolean } {
    switch (ev.type) {
      case "started":
        return { chunks: this.started(ev.promptTokens), last: false };
      case "token": {
        const piece = this.#calls ? this.#calls.push(ev.text) : { content: ev.text, calls: [] };
        return { chunks: this.pieces(piece), last: false };
      }
      case "done": {
        if (ev.finishReason === "cancelled") return this.#failed(serverCut());
        const out = this.#calls
          ? this.pieces(this.#calls.finish(ev.finishReason === "length"))
          : [];
        this.finished(ev, out);
        return { chunks: out, last: true };
      }
      case "error":
        return this.#failed(fromGenerationError(ev.code, ev.message));
    }
  }

  #failed(err: ApiError): { chunks: string[]; last: boolean } {
    this.metrics.errors.inc({ code: err.code });
    return { chunks: [this.errorEvent(err)], last: true };
  }
}
