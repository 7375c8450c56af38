import type { GenerationRequest } from "../core/generation.ts";
import { outputConstraint } from "./response_format.ts";
import type { OutputConstraint } from "../grammar/output_constraint.ts";
import type { ChatRenderer } from "../chat/chat_template.ts";
import { ApiError, fromGenerationError, preview, toApiError } from "./errors.ts";
import { type FrameSocket, FrameWriter, type WriterOptions } from "./frame_writer.ts";
import { buildGenerationRequest, type GenerationInput } from "./generation_request.ts";
import { logitControlsFrom } from "./sampling_controls.ts";
import { errorFrame, round, statsFrame, timingsJson, usageJson } from "./protocol.ts";
import {
  type CancelFrame,
  CLIENT_FRAMES,
  type ClientFrameType,
  type GenerateFrame,
} from "./schemas.ts";
import { type GenerationDeps, trackGeneration } from "./tracked_generation.ts";
import { parseWith } from "./validation.ts";

export interface SessionOptions {
  readonly renderChat: ChatRenderer;
  readonly maxFrameBytes: number;
  readonly maxGenerationsPerSocket: number;
  readonly statsIntervalMs: number;
  readonly writer: WriterOptions;
  /**
   * A socket that sent no frame and ran no generation for this long is closed with 1000
   * (0: never). Idle sockets otherwise held connection slots for good: 704 of them locked
   * every other client out.
   */
  readonly idleTimeoutMs?: number;
}

interface LiveGeneration {
  readonly ctrl: AbortController;
  cancelled: boolean;
}

const FRAME_TYPES = Object.keys(CLIENT_FRAMES) as ClientFrameType[];

/** WebSocket close code for a server going away (drain). */
export const CLOSE_GOING_AWAY = 1001;
/** WebSocket close code for an orderly close (an idle socket). */
export const CLOSE_NORMAL = 1000;

/**
 * One client socket on `GET /v1/stream`: parses and validates client frames, runs any number
 * of generations at once (told apart by the client's ids), streams their events back through
 * a backpressured writer, and cancels everything it started when the socket closes.
 * A bad frame is answered with an error frame; it never closes the socket or touches another
 * generation.
 */
export class StreamSession {
  #deps: GenerationDeps;
  #opts: SessionOptions;
  #sock: FrameSocket;
  #writer: FrameWriter;
  #gens = new Map<string, LiveGeneration>();
  #statsTimer: ReturnType<typeof setInterval> | undefined;
  #closed = false;
  #started = 0;

  constructor(
    deps: GenerationDeps,
    opts: SessionOptions,
    sock: FrameSocket,
    readonly sessionId: string,
    /** Its API key's cache scope, if it has one. */
    readonly cacheScope?: string,
  ) {
    this.#deps = deps;
    this.#opts = opts;
    this.#sock = sock;
    this.#writer = new FrameWriter(sock, opts.writer);
    this.#armIdle();
  }

  #idleTimer: ReturnType<typeof setTimeout> | undefined;
  #lastFrameAt = performance.now();

  #armIdle(): void {
    const ms = this.#opts.idleTimeoutMs ?? 0;
    if (!(ms > 0) || this.#closed) return;
    const left = this.#lastFrameAt + ms - performance.now();
    this.#idleTimer = setTimeout(() => {
      this.#idleTimer = undefined;
      if (this.#closed) return;
      if (this.#gens.size === 0 && performance.now() - this.#lastFrameAt >= ms) {
        this.close(CLOSE_NORMAL, `idle for ${Math.round(ms / 1000)} s`);
      } else {
        // Busy or recently active: counted again from the last frame or generation.
        if (this.#gens.size > 0) this.#lastFrameAt = performance.now();
        this.#armIdle();
      }
    }, Math.max(10, left));
  }

  /** Generations running on this socket. */
  get liveGenerations(): number {
    return this.#gens.size;
  }

  onMessage(data: unknown): void {
    if (this.#closed) return;
    this.#lastFrameAt = performance.now();
    // The frame's id, once known, goes into the error so the client knows which one failed.
    let id: string | undefined;
    let type: unknown;
    try {
      const frame = this.#decode(data);
      if (typeof frame.id === "string") id = frame.id;
      type = frame.type;
      this.#dispatch(frame);
    } catch (err) {
      const e = toApiError(err);
      if (type === "generate") {
        // A refused generation gets its log line too.
        const record = this.#deps.requestLog.record(
          `${this.sessionId}.${++this.#started}/${id ?? "?"}`,
          "WS",
          "/v1/stream",
        );
        record.code = e.code;
        record.responded(e.status);
      }
      this.#sendError(e, id);
    }
  }

  /** The socket closed: abort every generation it started and stop the stats feed. */
  onClose(): void {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#idleTimer);
    for (const g of this.#gens.values()) g.ctrl.abort("socket closed");
    if (this.#statsTimer !== undefined) clearInterval(this.#statsTimer);
    this.#statsTimer = undefined;
    this.#writer.dispose();
  }

  /** Closes the socket from the server side (drain, shutdown). */
  close(code = CLOSE_GOING_AWAY, reason = "server is shutting down"): void {
    if (this.#sock.isOpen) this.#sock.close(code, reason);
    this.onClose();
  }

  #decode(data: unknown): Record<string, unknown> {
    if (typeof data !== "string") {
      throw new ApiError(
        "unsupported_frame",
        "Binary frames are not supported; send JSON text frames",
      );
    }
    const max = this.#opts.maxFrameBytes;
    if (data.length > max || (data.length * 3 > max && utf8Length(data) > max)) {
      throw new ApiError(
        "frame_too_large",
        `Frame is ${utf8Length(data)} bytes; the limit is ${max} bytes`,
      );
    }
    let frame: unknown;
    try {
      frame = JSON.parse(data);
    } catch (err) {
      throw new ApiError(
        "invalid_json",
        `Frame is not valid JSON: ${err instanceof Error ? err.message : err}`,
      );
    }
    if (frame === null || typeof frame !== "object" || Array.isArray(frame)) {
      throw new ApiError(
        "invalid_request",
        `Frame must be a JSON object with a 'type' field; received ${preview(frame)}`,
      );
    }
    return frame as Record<string, unknown>;
  }

  #dispatch(frame: Record<string, unknown>): void {
    const type = frame.type;
    if (typeof type !== "string" || !(FRAME_TYPES as string[]).includes(type)) {
      throw new ApiError(
        "unknown_type",
        `Unknown frame type ${preview(type)}; expected one of ${FRAME_TYPES.join(", ")}`,
        "type",
      );
    }
    switch (type as ClientFrameType) {
      case "generate":
        return this.#generate(parseWith(CLIENT_FRAMES.generate, frame));
      case "cancel":
        return this.#cancel(parseWith(CLIENT_FRAMES.cancel, frame));
      case "subscribe_stats":
        parseWith(CLIENT_FRAMES.subscribe_stats, frame);
        return this.#subscribeStats();
      case "unsubscribe_stats":
        parseWith(CLIENT_FRAMES.unsubscribe_stats, frame);
        if (this.#statsTimer !== undefined) clearInterval(this.#statsTimer);
        this.#statsTimer = undefined;
        return;
    }
  }

  #generate(f: GenerateFrame): void {
    if (this.#gens.has(f.id)) {
      throw new ApiError(
        "duplicate_id",
        `Generation id "${f.id}" is already running on this socket; ids of live generations ` +
          "must be unique",
        "id",
      );
    }
    if (this.#gens.size >= this.#opts.maxGenerationsPerSocket) {
      throw new ApiError(
        "too_many_generations",
        `This socket already runs ${this.#gens.size} generations, the limit per socket; ` +
          "wait for one to finish or open another socket",
      );
    }
    let input: GenerationInput;
    const sampling = {
      maxTokens: f.max_tokens,
      temperature: f.temperature,
      topK: f.top_k,
      topP: f.top_p,
      minP: f.min_p,
      seed: f.seed,
      stop: f.stop,
      priority: f.priority,
      logprobs: f.logprobs ?? false,
      topLogprobs: f.top_logprobs,
      controls: logitControlsFrom(f),
      stopTokenIds: f.stop_token_ids,
      ignoreEos: f.ignore_eos,
      ...constraintOf(f),
    };
    if (f.messages !== undefined) {
      const chat = this.#opts.renderChat(f.messages, f.chat_template_kwargs);
      input = {
        ...sampling,
        prompt: chat.prompt,
        promptParam: "messages",
        extraStop: chat.stop,
        specialTokens: chat.special,
      };
    } else {
      input = { ...sampling, prompt: f.prompt ?? "", promptParam: "prompt" };
    }
    const built = buildGenerationRequest(
      input,
      this.#deps.backend,
      // Unique even when the client reuses an id after its generation ended.
      `${this.sessionId}.${++this.#started}/${f.id}`,
    );
    const { maxTokensCapped } = built;
    const request = this.cacheScope === undefined
      ? built.request
      : { ...built.request, cacheScope: this.cacheScope };
    const gen: LiveGeneration = { ctrl: new AbortController(), cancelled: false };
    this.#gens.set(f.id, gen);
    this.#run(f.id, gen, request, maxTokensCapped, built.promptTokens).catch((err) => {
      this.#sendError(toApiError(err), f.id);
    });
  }

  async #run(
    id: string,
    gen: LiveGeneration,
    request: GenerationRequest,
    capped: boolean,
    promptTokens: number,
  ): Promise<void> {
    let terminal = false;
    let completion = 0;
    // What the core counted once it started (a cancel can come before).
    let prompt = promptTokens;
    // One request-log line per generation; its status is what the HTTP API would answer.
    const record = this.#deps.requestLog.record(request.requestId, "WS", "/v1/stream");
    let status = 200;
    try {
      const events = trackGeneration(this.#deps, request, "stream", gen.ctrl.signal, record);
      for await (const ev of events) {
        let open = true;
        if (ev.type === "started") {
          prompt = ev.promptTokens;
          open = await this.#writer.send({
            type: "started",
            id,
            prompt_tokens: ev.promptTokens,
            max_tokens: request.maxTokens,
            max_tokens_capped: capped,
          });
        } else if (ev.type === "token") {
          if (gen.cancelled) continue;
          completion += ev.ids.length;
          open = await this.#writer.send({
            type: "token",
            id,
            text: ev.text,
            token_ids: ev.ids,
            ...(request.logprobs ? { logprob: ev.logprob } : {}),
            ...(request.logprobs && ev.top
              ? {
                top_logprobs: ev.top.ids.map((tid, k) => ({
                  token_id: tid,
                  text: this.#deps.backend.detokenize([tid]),
                  logprob: ev.top!.logprobs[k],
                })),
              }
              : {}),
          });
        } else if (ev.type === "done") {
          terminal = true;
          // Free the id before the client can see "done" and reuse it.
          this.#release(id, gen);
          await this.#writer.send({
            type: "done",
            id,
            finish_reason: gen.cancelled ? "cancelled" : ev.finishReason,
            usage: usageJson(ev.usage),
            timings: timingsJson(ev.timings),
            max_tokens_capped: capped,
            cached: ev.cached !== undefined,
            ...(ev.cached !== undefined ? { saved_ms: round(ev.cached.savedMs) } : {}),
          });
        } else {
          terminal = true;
          this.#release(id, gen);
          const err = fromGenerationError(ev.code, ev.message);
          status = err.status;
          this.#sendError(err, id);
        }
        if (!open) break; // socket gone: leaving the loop aborts the generation
      }
    } finally {
      record.responded(status);
      this.#release(id, gen);
      if (!terminal && !this.#closed) {
        // The core ended without a final event (it was aborted): report the cancel ourselves.
        void this.#writer.send({
          type: "done",
          id,
          finish_reason: "cancelled",
          // The prefix cache's share is the backend's to report, and it did not: absent, not 0.
          usage: {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
          },
          timings: null,
          max_tokens_capped: capped,
          cached: false,
        });
      }
    }
  }

  /** Forgets a generation's id, unless the client already reused it for a newer one. */
  #release(id: string, gen: LiveGeneration): void {
    if (this.#gens.get(id) === gen) this.#gens.delete(id);
    this.#lastFrameAt = performance.now();
  }

  #cancel(f: CancelFrame): void {
    const gen = this.#gens.get(f.id);
    if (gen === undefined) {
      throw new ApiError(
        "unknown_id",
        `No live generation with id "${f.id}" on this socket (it may have finished already)`,
        "id",
      );
    }
    gen.cancelled = true;
    gen.ctrl.abort("cancelled by client");
  }

  #subscribeStats(): void {
    const push = () => {
      this.#writer.trySend(statsFrame(this.#deps.backend.stats(), this.#deps.inflight.size));
    };
    push();
    if (this.#statsTimer === undefined) {
      this.#statsTimer = setInterval(push, this.#opts.statsIntervalMs);
    }
  }

  #sendError(err: ApiError, id?: string): void {
    this.#deps.metrics.errors.inc({ code: err.code });
    // Not awaited: an error answers a client frame, so the client's own sending bounds them.
    void this.#writer.send(errorFrame(err, id));
  }
}

function utf8Length(s: string): number {
  return new TextEncoder().encode(s).byteLength;
}

/** A frame's output constraint, as the HTTP bodies give it (400-style error naming the field). */
function constraintOf(f: GenerateFrame): { constraint?: OutputConstraint } {
  const constraint = outputConstraint(f);
  return constraint ? { constraint } : {};
}
