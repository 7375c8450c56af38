import type { GenerationEvent, GenerationRequest } from "../core/generation.ts";
import { ApiError, fromGenerationError } from "./errors.ts";
import { buildGenerationRequest, type GenerationInput } from "./generation_request.ts";
import type { RequestRecord } from "./request_log.ts";
import { pullSseStream } from "./sse.ts";
import { type Api, type GenerationDeps, trackGeneration } from "./tracked_generation.ts";
import { DRAINED_MESSAGE } from "../core/draining.ts";

/** What a route that runs one generation needs of the app (the OpenAI routes' options). */
export interface RunOptions {
  readonly recordOf: (req: Request) => RequestRecord | undefined;
  readonly scopeOf: (req: Request) => string | undefined;
  readonly stallTimeoutMs: number;
}

/** One generation, started and past its first event. */
export interface Started {
  readonly request: GenerationRequest;
  /** The context had less room than max_tokens asked for (see buildGenerationRequest). */
  readonly maxTokensCapped: boolean;
  readonly record: RequestRecord | undefined;
  /** Every event, the first included; return() ends the generation. */
  readonly events: AsyncGenerator<GenerationEvent>;
  /** Ends the generation (the client went away). */
  abort(): void;
  /** Detaches the client-gone listener (before a streamed body is returned, or at the end). */
  release(): void;
}

/**
 * Starts one generation for the APIs spelled other than OpenAI's (Ollama's, Anthropic's), as
 * the OpenAI routes do: the model's limits (buildGenerationRequest, with a smaller context
 * when the client asked for one), the key's cache scope, the in-flight bookkeeping
 * (trackGeneration) and the client's disconnect. The first event decides the status: an
 * overloaded or draining core, or a prompt the core refused, is thrown as an ApiError.
 */
export async function startGeneration(
  req: Request,
  input: GenerationInput,
  deps: GenerationDeps,
  opts: RunOptions,
  api: Api,
  id: string,
  contextLength = deps.backend.contextLength,
): Promise<Started> {
  const record = opts.recordOf(req);
  if (record?.generated) record.id = id;
  const b = deps.backend;
  const limits = {
    contextLength,
    tokenize: (t: string, o: { bos: boolean; special: boolean }) => b.tokenize(t, o),
    ...(b.minTokens ? { minTokens: (t: string) => b.minTokens!(t) } : {}),
    ...(b.vocabSize !== undefined ? { vocabSize: b.vocabSize } : {}),
    ...(b.samplingDefaults ? { samplingDefaults: b.samplingDefaults } : {}),
  };
  const built = buildGenerationRequest(input, limits, record?.id ?? id);
  const scope = opts.scopeOf(req);
  const request = scope === undefined ? built.request : { ...built.request, cacheScope: scope };
  const ctrl = new AbortController();
  const onClientGone = () => ctrl.abort("client gone");
  req.signal.addEventListener("abort", onClientGone, { once: true });
  const release = () => req.signal.removeEventListener("abort", onClientGone);
  const head = trackGeneration(deps, request, api, ctrl.signal, record);
  const first = await head.next();
  if (first.done || first.value.type === "error") {
    release();
    await head.return(undefined);
    if (first.done) throw new ApiError("internal", "The core ended the generation without events");
    const ev = first.value as Extract<GenerationEvent, { type: "error" }>;
    throw fromGenerationError(ev.code, ev.message);
  }
  const firstEvent = first.value;
  async function* all(): AsyncGenerator<GenerationEvent> {
    try {
      yield firstEvent;
      yield* head;
    } finally {
      await head.return(undefined);
    }
  }
  return {
    request,
    maxTokensCapped: built.maxTokensCapped,
    record,
    events: all(),
    abort: () => ctrl.abort("client gone"),
    release,
  };
}

/**
 * A streamed body of a started generation: `render` turns each event into the lines or events
 * to send (`last` ends the stream). Pulled at the client's pace, cut when the client stalls,
 * the generation ended when the client goes away; the request-log line waits for the end.
 */
export function streamBody(
  run: Started,
  deps: GenerationDeps,
  opts: RunOptions,
  render: (ev: GenerationEvent) => { chunks: string[]; last: boolean },
): ReadableStream<Uint8Array> {
  const { events, record } = run;
  // Deno warns about request.signal listeners still attached when a streamed body is returned;
  // from here the body's cancel() reports a client that went away.
  run.release();
  return renderedEventStream(events, record, render, () => run.abort(), deps, opts.stallTimeoutMs);
}

/**
 * The SSE body of a generation's events, each rendered to chunks by `render`: the request's log
 * line waits for the stream's end (so it has the token counts and the total time), the
 * generation ends after the event `render` calls last, a cancelled body aborts it, and a stall
 * is counted as `too_slow`.
 */
export function renderedEventStream<E>(
  events: AsyncGenerator<E>,
  record: RequestRecord | undefined,
  render: (ev: E) => { chunks: string[]; last: boolean },
  abort: () => void,
  deps: GenerationDeps,
  stallTimeoutMs: number,
): ReadableStream<Uint8Array> {
  record?.defer();
  let ended = false;
  return pullSseStream(async () => {
    if (ended) {
      record?.streamEnded();
      return null;
    }
    const n = await events.next();
    if (n.done) {
      ended = true;
      record?.streamEnded();
      return null;
    }
    const { chunks, last } = render(n.value);
    if (last) {
      ended = true;
      await events.return(undefined);
    }
    return chunks;
  }, async () => {
    abort();
    await events.return(undefined);
    record?.streamEnded();
  }, {
    stallTimeoutMs,
    onStall: () => {
      deps.metrics.errors.inc({ code: "too_slow" });
      if (record) record.code = "too_slow";
    },
  });
}
/**
 * A generation the server ended while its client still waited (the drain deadline): a 503 to
 * retry elsewhere, never a truncated answer passed off as complete.
 */
export function serverCut(): ApiError {
  return new ApiError("draining", DRAINED_MESSAGE);
}

/**
 * Drains a non-streamed generation: its text and final event. A generation the server cut
 * while the client still waits (drain deadline) is a 503, not a truncated 200.
 */
export async function collectText(
  run: Started,
  client: AbortSignal,
): Promise<{ text: string; done: Extract<GenerationEvent, { type: "done" }> }> {
  let text = "";
  try {
    for await (const ev of run.events) {
      if (ev.type === "token") text += ev.text;
      else if (ev.type === "error") throw fromGenerationError(ev.code, ev.message);
      else if (ev.type === "done") {
        if (ev.finishReason === "cancelled" && !client.aborted) throw serverCut();
        return { text, done: ev };
      }
    }
  } finally {
    run.release();
    await run.events.return(undefined);
  }
  throw new ApiError("internal", "The generation ended without a result (cancelled)");
}
