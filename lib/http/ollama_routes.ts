import type { Hono } from "hono";
import type { GenerationEvent } from "../core/generation.ts";
import { type ParsedToolCall, parseToolCalls, ToolCallStream } from "../chat/tool_calls.ts";
import { readJsonBody } from "./body.ts";
import { ApiError, fromGenerationError } from "./errors.ts";
import { ollamaError } from "./error_shapes.ts";
import {
  collectText,
  serverCut,
  type Started,
  startGeneration,
  streamBody,
} from "./generation_run.ts";
import { type ModelFacts, psEntry, readModelFacts, showBody, tagsEntry } from "./ollama_models.ts";
import {
  parseOllamaChat,
  parseOllamaGenerate,
  requestContext,
  servedOllamaName,
} from "./ollama_request.ts";
import {
  OllamaChatBody,
  OllamaEmbedBody,
  OllamaEmbeddingsBody,
  OllamaGenerateBody,
  OllamaModelBody,
} from "./ollama_schema.ts";
import { embedInputs } from "./embeddings_route.ts";
import { type OpenAiOptions, type Parsed, servedName } from "./openai_routes.ts";
import { newRequestId } from "./request_log.ts";
import type { GenerationDeps } from "./tracked_generation.ts";
import { parseWith } from "./validation.ts";

/**
 * Ollama's API (its docs/api.md), as another spelling of the OpenAI routes' requests: the
 * bodies map onto the OpenAI parser (ollama_request.ts), the generation runs through the same
 * seam (generation_run.ts), and the answers are Ollama's: NDJSON lines by default, one object
 * with `stream: false`, the timings in nanoseconds. Errors are `{"error": "..."}` (the app's
 * error mapping picks the shape by path, error_shapes.ts).
 */

export interface OllamaRouteOptions {
  readonly openAi: OpenAiOptions;
  /** The served model's file, for the listings' size, format and details. */
  readonly modelPath?: string;
}

/** The Ollama release whose API this follows; clients read it to know which fields exist. */
export const OLLAMA_API_VERSION = "0.12.0";

const NDJSON = { "content-type": "application/x-ndjson", "cache-control": "no-cache" };

/** Nanoseconds from milliseconds, as Ollama's durations are. */
const ns = (ms: number) => Math.max(0, Math.round(ms * 1e6));

const HOW_MODELS_ARE_ADDED = "this server does not download or build models: it serves the " +
  "model files it was started with (`serve --model FILE`, or several with `serve --models " +
  "FILE`; see docs/models.md)";

/** A served name and its model's file, as the listings show them. */
export interface ListedModel {
  readonly name: string;
  readonly path?: string;
}

export interface OllamaListingOptions {
  /** Every name served, the default model's first (read at each request). */
  readonly models: () => readonly ListedModel[];
  /** Whether the model a name stands for is loaded now (/api/ps lists those). */
  readonly loaded: (name: string) => boolean;
  readonly maxBodyBytes: number;
}

/**
 * The routes of Ollama's API that need no model: the version, the listings, pull, and the
 * 501s of model management. A server of one model mounts them in its app; the front of several models mounts them
 * itself, over its catalog, so a listing neither loads nor names only one model.
 */
export function registerOllamaListings(app: Hono, o: OllamaListingOptions): void {
  const facts = new Map<string, Promise<ModelFacts>>();
  const factsOf = (path: string | undefined) => {
    let f = facts.get(path ?? "");
    if (f === undefined) facts.set(path ?? "", f = readModelFacts(path));
    return f;
  };
  const list = (models: readonly ListedModel[], entry: typeof tagsEntry) =>
    Promise.all(models.map(async (m) => entry(m.name, await factsOf(m.path))));
  app.get("/api/version", (c) => c.json({ version: OLLAMA_API_VERSION }));
  app.get("/api/tags", async (c) => c.json({ models: await list(o.models(), tagsEntry) }));
  app.get("/api/ps", async (c) => {
    const loaded = o.models().filter((m) => o.loaded(m.name));
    return c.json({ models: await list(loaded, psEntry) });
  });
  app.post("/api/pull", async (c) => {
    const b = parseWith(OllamaModelBody, await readJsonBody(c.req.raw, o.maxBodyBytes));
    const asked = b.model ?? b.name ?? "";
    const served = o.models().map((m) => m.name);
    if (!served.includes(servedOllamaName(asked, served))) {
      throw new ApiError(
        "model_not_found",
        `The model ${JSON.stringify(asked)} is not served here, and ${HOW_MODELS_ARE_ADDED}; ` +
          `served: ${served.map((n) => JSON.stringify(n)).join(", ")}`,
        "model",
      );
    }
    // Already here: a pull of a served model succeeds at once, as Ollama's does when it has it.
    return c.json({ status: "success" });
  });
  for (
    const [method, path] of [
      ["POST", "/api/create"],
      ["POST", "/api/copy"],
      ["POST", "/api/push"],
      ["DELETE", "/api/delete"],
    ] as const
  ) {
    app.on(method, path, () => {
      throw new ApiError("not_implemented", `${path} is not supported: ${HOW_MODELS_ARE_ADDED}`);
    });
  }
}

/** Ollama's routes of one model's app: chat, generate, show and embed, with the listings. */
export function registerOllamaRoutes(app: Hono, deps: GenerationDeps, o: OllamaRouteOptions) {
  const served = o.openAi.servedModelNames;
  let facts: Promise<ModelFacts> | undefined;
  app.post("/api/chat", (c) => generate(c.req.raw, "chat", deps, o.openAi));
  app.post("/api/generate", (c) => generate(c.req.raw, "generate", deps, o.openAi));
  app.post("/api/show", async (c) => {
    const b = parseWith(OllamaModelBody, await readJsonBody(c.req.raw, o.openAi.maxBodyBytes));
    const asked = b.model ?? b.name ?? "";
    servedName(servedOllamaName(asked, served), served);
    facts ??= readModelFacts(o.modelPath);
    return c.json(showBody(deps.backend, o.modelPath, await facts));
  });
  app.post("/api/embed", async (c) => {
    const t0 = performance.now();
    const b = parseWith(OllamaEmbedBody, await readJsonBody(c.req.raw, o.openAi.maxBodyBytes));
    const model = servedName(servedOllamaName(b.model, served), served);
    const out = await embedInputs(deps.backend, model, b.input, b.dimensions, c.req.raw.signal);
    return c.json({
      model: b.model,
      embeddings: out.vectors.map((v) => Array.from(v)),
      total_duration: ns(performance.now() - t0),
      // The model is loaded before the server is ready; embeddings are not queued apart.
      load_duration: 0,
      prompt_eval_count: out.promptTokens,
    });
  });
  app.post("/api/embeddings", async (c) => {
    const b = parseWith(OllamaEmbeddingsBody, await readJsonBody(c.req.raw, o.openAi.maxBodyBytes));
    const model = servedName(servedOllamaName(b.model, served), served);
    const out = await embedInputs(deps.backend, model, b.prompt, undefined, c.req.raw.signal);
    return c.json({ embedding: Array.from(out.vectors[0]!) });
  });
  registerOllamaListings(app, {
    models: () => served.map((name) => ({ name, ...(o.modelPath ? { path: o.modelPath } : {}) })),
    loaded: () => true,
    maxBodyBytes: o.openAi.maxBodyBytes,
  });
}

type Route = "chat" | "generate";

async function generate(
  req: Request,
  route: Route,
  deps: GenerationDeps,
  opts: OpenAiOptions,
): Promise<Response> {
  const t0 = performance.now();
  const raw = await readJsonBody(req, opts.maxBodyBytes);
  const b = route === "chat" ? parseWith(OllamaChatBody, raw) : parseWith(OllamaGenerateBody, raw);
  const model = servedOllamaName(b.model, opts.servedModelNames);
  // No messages (or an empty prompt): Ollama's way to load a model; it is loaded here.
  const empty = route === "chat"
    ? ((b as OllamaChatBody).messages ?? []).length === 0
    : ((b as OllamaGenerateBody).prompt ?? "") === "";
  if (empty) {
    servedName(model, opts.servedModelNames);
    return Response.json({
      ...head(b.model, route, ""),
      done_reason: "load",
      done: true,
    });
  }
  const parsed = route === "chat"
    ? parseOllamaChat(b as OllamaChatBody, model, opts)
    : parseOllamaGenerate(b as OllamaGenerateBody, model, opts);
  const context = requestContext(b.options, deps.backend.contextLength);
  const id = "ollama-" + newRequestId();
  const run = await startGeneration(req, parsed.input, deps, opts, "ollama", id, context)
    .catch((e) => {
      throw context < deps.backend.contextLength ? numCtxBlamed(e, context) : e;
    });
  const reply = new Reply(b.model, route, parsed, t0, deps.metrics);
  if (b.stream === false) return Response.json(await reply.whole(run, req.signal));
  return new Response(streamBody(run, deps, opts, (ev) => reply.lines(ev)), { headers: NDJSON });
}

/** A prompt too long for a smaller num_ctx: say which limit it passed. */
function numCtxBlamed(e: unknown, context: number): unknown {
  if (!(e instanceof ApiError) || e.code !== "context_length_exceeded") return e;
  return new ApiError(
    e.code,
    `${e.message} (the context here is options.num_ctx, ${context} tokens)`,
    e.param,
  );
}

/** A call in Ollama's shape: the arguments as an object. */
interface OllamaCall {
  readonly function: { index: number; name: string; arguments: unknown };
}

/** Parsed calls in Ollama's shape, numbered from `first`. */
function ollamaCalls(calls: readonly ParsedToolCall[], first = 0): OllamaCall[] {
  return calls.map((c, k) => ({
    function: { index: first + k, name: c.name, arguments: JSON.parse(c.arguments) },
  }));
}

/** The fields every line of an answer starts with, its text under the route's key. */
function head(model: string, route: Route, text: string, calls: readonly OllamaCall[] = []) {
  const base = { model, created_at: new Date().toISOString() };
  if (route === "generate") return { ...base, response: text };
  return {
    ...base,
    message: { role: "assistant", content: text, ...(calls.length ? { tool_calls: calls } : {}) },
  };
}

/** One answer in Ollama's shape, whole or as NDJSON lines (exported for its tests). */
export class Reply {
  readonly #calls: ToolCallStream | undefined;
  #callCount = 0;

  constructor(
    readonly model: string,
    readonly route: Route,
    readonly parsed: Parsed,
    /** When the request arrived: total_duration runs from here. */
    readonly t0: number,
    readonly metrics: GenerationDeps["metrics"],
  ) {
    this.#calls = parsed.toolFormat ? new ToolCallStream(parsed.toolFormat) : undefined;
  }

  /** The last line's fields: why it ended, and the measured counts and durations. */
  #end(ev: Extract<GenerationEvent, { type: "done" }>) {
    const t = ev.timings;
    return {
      done: true,
      done_reason: ev.finishReason,
      total_duration: ns(performance.now() - this.t0),
      // Ollama's load_duration is its wait for a runner with the model; here the model is
      // loaded, and the wait is the scheduler's queue.
      load_duration: ns(t.queuedMs),
      prompt_eval_count: ev.usage.promptTokens,
      prompt_eval_duration: ns(t.prefillMs),
      eval_count: ev.usage.completionTokens,
      eval_duration: ns(t.decodeMs),
    };
  }

  async whole(run: Started, client: AbortSignal) {
    const { text, done } = await collectText(run, client);
    const format = this.parsed.toolFormat;
    const out = format === undefined
      ? { content: text, calls: [] }
      : parseToolCalls(text, format, done.finishReason === "length");
    const calls = ollamaCalls(out.calls);
    return { ...head(this.model, this.route, out.content ?? "", calls), ...this.#end(done) };
  }

  #line(text: string, calls: readonly ParsedToolCall[] = []): string {
    const numbered = ollamaCalls(calls, this.#callCount);
    this.#callCount += calls.length;
    return JSON.stringify({ ...head(this.model, this.route, text, numbered), done: false }) + "\n";
  }

  /** A last line saying what went wrong, once the stream has begun (Ollama's shape). */
  #failed(err: ApiError): { chunks: string[]; last: boolean } {
    this.metrics.errors.inc({ code: err.code });
    return { chunks: [JSON.stringify(ollamaError(err)) + "\n"], last: true };
  }

  lines(ev: GenerationEvent): { chunks: string[]; last: boolean } {
    switch (ev.type) {
      case "started":
        return { chunks: [], last: false };
      case "token": {
        if (!this.#calls) return { chunks: [this.#line(ev.text)], last: false };
        return { chunks: this.#pieces(this.#calls.push(ev.text)), last: false };
      }
      case "done": {
        if (ev.finishReason === "cancelled") return this.#failed(serverCut());
        const rest = this.#calls
          ? this.#pieces(this.#calls.finish(ev.finishReason === "length"))
          : [];
        const last = { ...head(this.model, this.route, ""), ...this.#end(ev) };
        return { chunks: [...rest, JSON.stringify(last) + "\n"], last: true };
      }
      case "error":
        return this.#failed(fromGenerationError(ev.code, ev.message));
    }
  }

  #pieces(p: { content: string; calls: readonly ParsedToolCall[] }): string[] {
    const out: string[] = [];
    if (p.content !== "") out.push(this.#line(p.content));
    if (p.calls.length > 0) out.push(this.#line("", p.calls));
    return out;
  }
}
