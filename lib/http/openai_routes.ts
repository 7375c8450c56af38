import type { Hono } from "hono";
import type {
  FinishReason,
  GenerationBackend,
  GenerationEvent,
  SimilarQuestion,
  Usage,
} from "../core/generation.ts";
import { type ChoiceEvent, choiceRequests, mergeChoices } from "./choices.ts";
import { constraintField, outputConstraint } from "./response_format.ts";
import {
  chatTurns,
  newToolCallId,
  renderChatTools,
  type TemplateTools,
  toolPlan,
} from "../chat/tools.ts";
import {
  type ParsedToolCall,
  parseToolCalls,
  type ToolCallFormat,
  ToolCallStream,
} from "../chat/tool_calls.ts";
import type { ChatRenderer } from "../chat/chat_template.ts";
import { readJsonBody } from "./body.ts";
import { unknownModel } from "./model_catalog.ts";
import { ApiError, fromGenerationError } from "./errors.ts";
import { buildGenerationRequest, type GenerationInput } from "./generation_request.ts";
import { logitControlsFrom } from "./sampling_controls.ts";
import {
  chatChunk,
  type ChatFinishReason,
  completionChunk,
  type OpenAiToolCall,
  type ResponseExtras,
  responseExtras,
  type ResponseMeta,
  type TokenLogprob,
  type ToolCallDelta,
  usageChunk,
  wholeResponse,
} from "./openai_format.ts";
import { ChatCompletionBody, CompletionBody } from "./schemas.ts";
import { SSE_HEADERS, sseData } from "./sse.ts";
import { type Api, type GenerationDeps, trackGeneration } from "./tracked_generation.ts";
import { renderedEventStream } from "./generation_run.ts";
import { parseWith } from "./validation.ts";
import type { RequestRecord } from "./request_log.ts";
import { newRequestId } from "./request_log.ts";
import { DRAINED_MESSAGE } from "../core/draining.ts";

export interface OpenAiOptions {
  readonly renderChat: ChatRenderer;
  /** What the model's chat template does with tools (tools.ts templateTools). */
  readonly templateTools: TemplateTools;
  readonly maxBodyBytes: number;
  /** OpenAI's default for /v1/completions is 16; chat defaults to the rest of the context. */
  readonly defaultCompletionMaxTokens: number;
  /** Unix seconds reported as the model's `created`. */
  readonly createdAt: number;
  /** Names a request's `model` may give; the first is the one reported by default. */
  readonly servedModelNames: readonly string[];
  /** The request-log record of a request (set up by the app's middleware). */
  readonly recordOf: (req: Request) => RequestRecord | undefined;
  /** The request's cache scope (its API key's), if it has one. */
  readonly scopeOf: (req: Request) => string | undefined;
  /** An SSE stream whose client takes nothing for this long is cut (the WebSocket's 1008). */
  readonly stallTimeoutMs: number;
}

type Kind = "completions" | "chat_completions";

/** What a request inside the server asks for: a completion, a chat, embeddings, a message. */
export type ApiKind = Kind | "embeddings" | "messages";

/**
 * Answers one request as its route would (the same parsing, limits and errors; errors are
 * thrown as ApiError), for callers inside the server: the batch queue runs its lines through
 * it. `scope` stands for the cache scope of the key that sent the work.
 */
export type OpenAiHandler = (req: Request, kind: ApiKind, scope?: string) => Promise<Response>;

/** The other routes a batch line may name: POST /v1/embeddings and POST /v1/messages. */
export interface OtherHandlers {
  readonly embeddings: (req: Request) => Promise<Response>;
  readonly messages: (req: Request, scope?: string) => Promise<Response>;
}

export function openAiHandler(
  deps: GenerationDeps,
  opts: OpenAiOptions,
  others: OtherHandlers,
): OpenAiHandler {
  return (req, kind, scope) =>
    kind === "embeddings"
      ? others.embeddings(req)
      : kind === "messages"
      ? others.messages(req, scope)
      : respond(req, kind, deps, scope === undefined ? opts : { ...opts, scopeOf: () => scope });
}

/** What one request asked for, after validation. */
export interface Parsed {
  readonly input: GenerationInput;
  readonly stream: boolean;
  readonly includeUsage: boolean;
  /** Choices asked for (`n`). */
  readonly n: number;
  /** Completions' `echo`: the prompt, as text, to put before each choice's text. */
  readonly echo?: string | readonly number[];
  /** The served name the response reports: the one asked for, else the first. */
  readonly model: string;
  /** Chat with tools: the format the answer's calls are read in. */
  readonly toolFormat?: ToolCallFormat;
}

/**
 * The OpenAI-compatible endpoints: POST /v1/completions, POST /v1/chat/completions (JSON, or
 * SSE `data:` chunks ending in `data: [DONE]` when stream is true); GET /v1/models is the
 * catalog's (model_catalog.ts).
 * Errors are thrown as ApiError for the app's error handler, except once a stream has begun:
 * then the error is sent as a final `data: {"error": ...}` event.
 */
export function registerOpenAiRoutes(app: Hono, deps: GenerationDeps, opts: OpenAiOptions): void {
  app.post("/v1/completions", (c) => respond(c.req.raw, "completions", deps, opts));
  app.post("/v1/chat/completions", (c) => respond(c.req.raw, "chat_completions", deps, opts));
}

/**
 * The served name a request's `model` picks: absent means the first; one of the served names
 * is itself; anything else is 404 model_not_found (as vLLM answers), naming what is served.
 */
export function servedName(asked: string | null | undefined, served: readonly string[]): string {
  if (asked === undefined || asked === null) return served[0]!;
  if (served.includes(asked)) return asked;
  throw unknownModel(asked, served);
}

/**
 * Validates an OpenAI body into what the request asks for: the one parser every API spelling
 * (Ollama's, Anthropic's) maps its fields onto, so their limits and errors are these.
 */
export function parse(body: unknown, kind: Kind, opts: OpenAiOptions): Parsed {
  const served = opts.servedModelNames;
  if (kind === "completions") {
    const b = parseWith(CompletionBody, body);
    const model = servedName(b.model, served);
    const p = b.prompt;
    // One prompt: a string, token ids, or a one-element array of either.
    const prompt = typeof p === "string"
      ? p
      : typeof p[0] === "string"
      ? p[0]
      : Array.isArray(p[0])
      ? p[0]
      : (p as number[]);
    return {
      input: {
        ...common(b),
        prompt,
        promptParam: "prompt",
        maxTokens: b.max_tokens ?? nPredict(b.n_predict),
        defaultMaxTokens: opts.defaultCompletionMaxTokens,
        logprobs: b.logprobs !== null && b.logprobs !== undefined,
        topLogprobs: b.logprobs,
      },
      stream: b.stream === true,
      includeUsage: b.stream_options?.include_usage === true,
      n: b.n ?? 1,
      ...(b.echo ? { echo: echoPrompt(b, prompt) } : {}),
      model,
    };
  }
  const b = parseWith(ChatCompletionBody, body);
  const model = servedName(b.model, served);
  const tools = toolPlan(b, opts.templateTools, constraintField(b));
  const chat = renderChatTools(
    opts.renderChat,
    chatTurns(b.messages, opts.templateTools),
    b.chat_template_kwargs,
    tools,
  );
  return {
    input: {
      ...common(b),
      // A constrained call (tool_choice "required" or named, or "auto" in the generic format);
      // toolPlan refused a second one.
      ...(tools.constraint ? { constraint: tools.constraint } : {}),
      prompt: chat.prompt,
      promptParam: "messages",
      extraStop: chat.stop,
      specialTokens: chat.special,
      maxTokens: b.max_completion_tokens ?? b.max_tokens ?? nPredict(b.n_predict),
      logprobs: b.logprobs === true,
      topLogprobs: chatTopLogprobs(b),
      ...similarQuestion(b),
    },
    stream: b.stream === true,
    includeUsage: b.stream_options?.include_usage === true,
    n: b.n ?? 1,
    model,
    ...(tools.parse ? { toolFormat: tools.parse } : {}),
  };
}

/**
 * A chat whose last message is the user's text: that text is the question, and the rest of the
 * request that shapes the answer (earlier messages, tools, template variables) its context.
 */
function similarQuestion(b: ChatCompletionBody): { similar?: SimilarQuestion } {
  const last = b.messages.at(-1)!;
  const text = typeof last.content === "string"
    ? last.content
    : last.content?.map((p) => p.text).join("");
  if (last.role !== "user" || !text) return {};
  const context = JSON.stringify([
    b.messages.slice(0, -1),
    last.name ?? null,
    b.tools ?? null,
    b.tool_choice ?? null,
    b.chat_template_kwargs ?? null,
  ]);
  return { similar: { context, question: text } };
}

/**
 * The prompt to echo. With logprobs, OpenAI's echo lists the prompt tokens' logprobs too, and
 * the engines compute logits only for the rows they sample from: refused, naming it.
 */
function echoPrompt(
  b: CompletionBody,
  prompt: string | readonly number[],
): string | readonly number[] {
  if (b.logprobs !== null && b.logprobs !== undefined) {
    throw new ApiError(
      "invalid_request",
      "Invalid 'echo': echo with logprobs needs the prompt tokens' logprobs, which this server " +
        "does not compute (the engines return logits only for sampled rows); send echo without " +
        `logprobs; got echo true with logprobs ${b.logprobs}`,
      "echo",
    );
  }
  return prompt;
}

/** OpenAI: top_logprobs is only meaningful, and only accepted, with logprobs: true. */
function chatTopLogprobs(b: ChatCompletionBody): number | undefined {
  const n = b.top_logprobs ?? 0;
  if (n > 0 && b.logprobs !== true) {
    throw new ApiError(
      "invalid_request",
      `Invalid 'top_logprobs': top_logprobs needs logprobs: true; got ${n}`,
      "top_logprobs",
    );
  }
  return n > 0 ? n : undefined;
}

/** One token event's logprob entry, with its alternatives spelled out. */
function tokenLogprob(
  ev: Extract<GenerationEvent, { type: "token" }>,
  backend: GenerationBackend,
): TokenLogprob {
  if (ev.top === undefined) return { text: ev.text, logprob: ev.logprob };
  const top = ev.top.ids.map((id, k) => ({
    text: backend.detokenize([id]),
    logprob: ev.top!.logprobs[k]!,
  }));
  return { text: ev.text, logprob: ev.logprob, top };
}

/** llama-server's `n_predict`: -1 means up to the context, as no max_tokens does. */
function nPredict(n: number | null | undefined): number | undefined {
  return n === undefined || n === null || n === -1 ? undefined : n;
}

function common(b: CompletionBody | ChatCompletionBody) {
  const constraint = outputConstraint(b);
  return {
    ...(constraint ? { constraint } : {}),
    temperature: b.temperature,
    topK: b.top_k,
    topP: b.top_p,
    minP: b.min_p,
    seed: b.seed,
    stop: b.stop,
    priority: b.priority,
    ...(b.cache === false ? { noCache: true } : {}),
    controls: logitControlsFrom(b),
    stopTokenIds: b.stop_token_ids,
    ignoreEos: b.ignore_eos,
  };
}

async function respond(
  req: Request,
  kind: Kind,
  deps: GenerationDeps,
  opts: OpenAiOptions,
): Promise<Response> {
  const parsed = parse(await readJsonBody(req, opts.maxBodyBytes), kind, opts);
  const id = (kind === "completions" ? "cmpl-" : "chatcmpl-") + newRequestId();
  const record = opts.recordOf(req);
  // Without a client id, the response's id is the request id (header, log and trace).
  if (record?.generated) record.id = id;
  const built = buildGenerationRequest(parsed.input, deps.backend, record?.id ?? id);
  const { maxTokensCapped } = built;
  const scope = opts.scopeOf(req);
  const request = scope === undefined ? built.request : { ...built.request, cacheScope: scope };
  const ctrl = new AbortController();
  const onClientGone = () => ctrl.abort("client gone");
  req.signal.addEventListener("abort", onClientGone, { once: true });
  const choices = choiceRequests(request, parsed.n);
  const head = trackGeneration(deps, request, kind as Api, ctrl.signal, record);
  // The first event decides the status: an overloaded or draining core gets a real 503.
  const first = await head.next();
  if (first.done || first.value.type === "error") {
    req.signal.removeEventListener("abort", onClientGone);
    await head.return(undefined);
    if (first.done) throw new ApiError("internal", "The core ended the generation without events");
    const ev = first.value as Extract<GenerationEvent, { type: "error" }>;
    throw fromGenerationError(ev.code, ev.message);
  }
  const meta: ResponseMeta = {
    id,
    created: Math.floor(Date.now() / 1000),
    model: parsed.model,
  };
  const echo = parsed.echo === undefined
    ? ""
    : typeof parsed.echo === "string"
    ? parsed.echo
    : deps.backend.detokenize(parsed.echo);
  const events = mergeChoices(
    head,
    first.value,
    choices.slice(1).map((r) => () => trackGeneration(deps, r, kind as Api, ctrl.signal)),
  );
  if (!parsed.stream) {
    try {
      const body = await collect(
        kind,
        meta,
        events,
        parsed.n,
        request.logprobs === true,
        req.signal,
        maxTokensCapped,
        deps.backend,
        record,
        echo,
        parsed.toolFormat,
      );
      return Response.json(body);
    } finally {
      req.signal.removeEventListener("abort", onClientGone);
      // Lets the tracker record the end and the core release the sequence.
      await events.return(undefined);
    }
  }
  // From here the body stream's cancel() reports a client that went away. Deno warns about
  // request.signal listeners still attached when a handler returns a streamed body.
  req.signal.removeEventListener("abort", onClientGone);
  const render = streamRenderer(
    kind,
    meta,
    parsed.n,
    parsed.includeUsage,
    request.logprobs === true,
    maxTokensCapped,
    deps,
    record,
    echo,
    parsed.toolFormat,
  );
  const body = renderedEventStream(
    events,
    record,
    render,
    () => ctrl.abort("client gone"),
    deps,
    opts.stallTimeoutMs,
  );
  return new Response(body, { headers: SSE_HEADERS });
}

/** A request's choices' usage together: the prompt once, every choice's completion tokens. */
function totalUsage(usages: readonly Usage[]): Usage {
  return {
    promptTokens: usages[0]!.promptTokens,
    completionTokens: usages.reduce((n, u) => n + u.completionTokens, 0),
    cachedTokens: usages[0]!.cachedTokens,
  };
}

/** Drains a non-streaming generation (all its choices) into the response object. */
async function collect(
  kind: Kind,
  meta: ResponseMeta,
  events: AsyncGenerator<ChoiceEvent>,
  n: number,
  withLogprobs: boolean,
  client: AbortSignal,
  capped: boolean,
  backend: GenerationBackend,
  record: RequestRecord | undefined,
  echo: string,
  toolFormat: ToolCallFormat | undefined,
) {
  const texts = Array.from({ length: n }, () => echo);
  const lps = Array.from({ length: n }, (): TokenLogprob[] => []);
  const ends: (Extract<GenerationEvent, { type: "done" }> | undefined)[] = new Array(n);
  let done = 0;
  for await (const { index, event: ev } of events) {
    if (ev.type === "token") {
      texts[index] += ev.text;
      if (withLogprobs) lps[index]!.push(tokenLogprob(ev, backend));
    } else if (ev.type === "done") {
      // Cancelled while the client still waits means the server cut it off (drain deadline):
      // a 200 with truncated text would pass for an answer, so tell the client to retry.
      if (ev.finishReason === "cancelled" && !client.aborted) {
        throw new ApiError("draining", DRAINED_MESSAGE);
      }
      ends[index] = ev;
      if (++done < n) continue;
      const all = ends as Extract<GenerationEvent, { type: "done" }>[];
      const choices = all.map((e, i) => {
        const choice = {
          text: texts[i]!,
          finish: e.finishReason,
          logprobs: withLogprobs ? lps[i]! : null,
        };
        if (toolFormat === undefined) return choice;
        const out = parseToolCalls(texts[i]!, toolFormat, e.finishReason === "length");
        if (out.calls.length === 0) return choice;
        return {
          ...choice,
          text: out.content,
          finish: callsFinish(e.finishReason),
          toolCalls: out.calls.map(openAiToolCall),
        };
      });
      const usage = totalUsage(all.map((e) => e.usage));
      if (record && n > 1) record.completionTokens = usage.completionTokens;
      // The slowest choice's timings: the response was ready when it was.
      const timings = all.reduce(
        (a, e) => e.timings.totalMs > a.totalMs ? e.timings : a,
        all[0]!.timings,
      );
      const cached = all.every((e) => e.cached !== undefined) ? all[0]!.cached : undefined;
      const extras = responseExtras(capped, cached);
      const object = kind === "completions" ? "text_completion" : "chat.completion";
      return wholeResponse(object, meta, choices, usage, timings, extras);
    } else if (ev.type === "error") {
      throw fromGenerationError(ev.code, ev.message);
    }
  }
  throw new ApiError("internal", "The generation ended without a result (cancelled)");
}

/**
 * Turns the choices' core events into SSE events for one streaming response: each chunk names
 * its choice's index; the usage chunk (summed) and [DONE] follow the last choice's end.
 */
function streamRenderer(
  kind: Kind,
  meta: ResponseMeta,
  n: number,
  includeUsage: boolean,
  withLogprobs: boolean,
  capped: boolean,
  deps: GenerationDeps,
  record: RequestRecord | undefined,
  echo: string,
  toolFormat: ToolCallFormat | undefined,
): (ev: ChoiceEvent) => { chunks: string[]; last: boolean } {
  const sentRole = new Set<number>();
  // Chat with tools: each choice's text goes through a parser, which holds back what may be a
  // call; the logprobs of tokens held back go out with the next chunk sent.
  const parsers = toolFormat === undefined
    ? undefined
    : Array.from({ length: n }, () => new ToolCallStream(toolFormat));
  const heldLps = Array.from({ length: n }, (): TokenLogprob[] => []);
  const callCounts = new Array<number>(n).fill(0);
  const offsets = new Array<number>(n).fill(0);
  const usages: Usage[] = [];
  const object = kind === "completions" ? "text_completion" : "chat.completion.chunk";
  const chunk = (
    index: number,
    text: string | undefined,
    finish: ChatFinishReason | null,
    lp: TokenLogprob[],
    extras?: ResponseExtras,
    toolCalls?: ToolCallDelta[],
  ) => {
    if (kind === "completions") {
      const logprobs = withLogprobs && lp.length > 0
        ? { tokens: lp, offset: offsets[index]! }
        : null;
      offsets[index]! += text?.length ?? 0;
      return sseData(
        completionChunk(
          meta,
          text ?? "",
          finish as FinishReason | null,
          logprobs,
          includeUsage,
          extras,
          index,
        ),
      );
    }
    const delta: { role?: "assistant"; content?: string; tool_calls?: ToolCallDelta[] } = {};
    if (!sentRole.has(index)) delta.role = "assistant";
    sentRole.add(index);
    if (text !== undefined) delta.content = text;
    if (toolCalls !== undefined) delta.tool_calls = toolCalls;
    return sseData(
      chatChunk(meta, delta, finish, withLogprobs ? lp : null, includeUsage, extras, index),
    );
  };
  const more = (chunks: string[]) => ({ chunks, last: false });
  /** The chunks of what a choice's parser let through: content, then each call (two chunks). */
  const parsedChunks = (
    index: number,
    piece: { content: string; calls: readonly ParsedToolCall[] },
    lp: TokenLogprob[],
  ): string[] => {
    const held = heldLps[index]!;
    held.push(...lp);
    const out: string[] = [];
    const takeLps = () => held.splice(0, held.length);
    if (piece.content !== "") out.push(chunk(index, piece.content, null, takeLps()));
    for (const call of piece.calls) {
      const c = openAiToolCall(call);
      const k = callCounts[index]!++;
      out.push(chunk(index, undefined, null, takeLps(), undefined, [{
        index: k,
        id: c.id,
        type: "function",
        function: { name: c.function.name, arguments: "" },
      }]));
      out.push(
        chunk(index, undefined, null, [], undefined, [{
          index: k,
          function: { arguments: c.function.arguments },
        }]),
      );
    }
    return out;
  };
  return ({ index, event: ev }) => {
    switch (ev.type) {
      case "started":
        if (kind === "chat_completions") return more([chunk(index, "", null, [])]);
        // Completions' echo: the prompt is each choice's first text.
        return more(echo.length > 0 ? [chunk(index, echo, null, [])] : []);
      case "token": {
        const lp = [tokenLogprob(ev, deps.backend)];
        if (parsers) return more(parsedChunks(index, parsers[index]!.push(ev.text), lp));
        return more([chunk(index, ev.text, null, lp)]);
      }
      case "done": {
        // "cancelled" is not an OpenAI finish reason, and a client still reading did not
        // cancel: the server cut the stream (drain deadline). Say so, as a stream error.
        if (ev.finishReason === "cancelled") {
          const err = new ApiError("draining", DRAINED_MESSAGE);
          deps.metrics.errors.inc({ code: err.code });
          return { chunks: [sseData(err.toJSON())], last: true };
        }
        const cut = ev.finishReason === "length";
        const out = parsers ? parsedChunks(index, parsers[index]!.finish(cut), []) : [];
        const finish = callCounts[index]! > 0 ? callsFinish(ev.finishReason) : ev.finishReason;
        out.push(
          chunk(
            index,
            kind === "completions" ? "" : undefined,
            finish,
            heldLps[index]!.splice(0),
            responseExtras(capped, ev.cached),
          ),
        );
        usages.push(ev.usage);
        if (usages.length < n) return more(out);
        const usage = totalUsage(usages);
        if (record && n > 1) record.completionTokens = usage.completionTokens;
        if (includeUsage) out.push(sseData(usageChunk(meta, object, usage)));
        out.push(sseData("[DONE]"));
        return { chunks: out, last: true };
      }
      case "error": {
        const err = fromGenerationError(ev.code, ev.message);
        deps.metrics.errors.inc({ code: err.code });
        return { chunks: [sseData(err.toJSON())], last: true };
      }
    }
  };
}

/** An answer of calls ends with "tool_calls", unless it was cut short (length). */
function callsFinish(f: FinishReason): ChatFinishReason {
  return f === "stop" ? "tool_calls" : f;
}

function openAiToolCall(c: ParsedToolCall): OpenAiToolCall {
  return {
    id: newToolCallId(),
    type: "function",
    function: { name: c.name, arguments: c.arguments },
  };
}
