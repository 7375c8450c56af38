/**
 * Model dispatch: which model a request names, and passing it whole to that model's app (the
 * front of several models for every model, a plain router for the models besides its own).
 * The request has been through the front door's middleware (front_door.ts) by then: key, body
 * limit and request id are the front's, and the model's app logs and counts it.
 */
import type { Context, MiddlewareHandler } from "hono";
import type { ServiceApp } from "./app.ts";
import { isJsonMedia, readBodyText, rebuilt } from "./body.ts";
import { withRetryAfter } from "./error_mapping.ts";
import type { FrontDoor } from "./front_door.ts";
import { ApiError } from "./errors.ts";
import type { OpenAiHandler } from "./openai_routes.ts";
import { type Lease, ModelLoadError } from "./model_directory.ts";
import type { RequestRecords } from "./request_log_middleware.ts";

/** POST routes whose JSON body names the model. */
export const BODY_ROUTES: ReadonlySet<string> = new Set([
  "/v1/completions",
  "/v1/chat/completions",
  "/v1/embeddings",
  "/v1/rerank",
  "/tokenize",
  "/detokenize",
  // Ollama's and Anthropic's spellings (ollama_routes.ts, anthropic_routes.ts).
  "/api/chat",
  "/api/generate",
  "/api/show",
  "/api/embed",
  "/api/embeddings",
  "/v1/messages",
  "/v1/messages/count_tokens",
]);

/** What a request names: its JSON body's fields (undefined: not a JSON object), or ?model=. */
export interface Asked {
  readonly model: unknown;
  /** The body as read, where the route's body names the model. */
  readonly text?: string;
  readonly fields?: Record<string, unknown>;
}

/**
 * The model a request names: a body route's JSON `model` (read from a copy, so the request's
 * own body stays unread), else `?model=` (a WebSocket, the playground, /props). Undefined: none.
 */
export async function askedModel(req: Request, path: string, maxBytes: number): Promise<Asked> {
  if (req.method === "POST" && BODY_ROUTES.has(path)) {
    // Another medium: the model's app says what is wrong with it, without it being read here.
    if (!isJsonMedia(req.headers.get("content-type"))) return { model: undefined };
    const text = await readBodyText(req.clone(), maxBytes);
    const fields = objectBody(text);
    return { model: fields?.model ?? undefined, text, ...(fields === undefined ? {} : { fields }) };
  }
  return { model: new URL(req.url).searchParams.get("model") ?? undefined };
}

/** A request body's fields when it is a JSON object; undefined for anything else. */
export function objectBody(text: string): Record<string, unknown> | undefined {
  try {
    const body = JSON.parse(text);
    if (body !== null && typeof body === "object" && !Array.isArray(body)) return body;
  } catch { /* not JSON: the model's app says so */ }
  return undefined;
}

/** A load that failed, as the client's answer (Retry-After only where waiting may help). */
export function loadError(err: ModelLoadError): ApiError {
  return withRetryAfter(
    new ApiError(
      err.insufficientMemory ? "insufficient_memory" : "model_load_failed",
      err.message,
      "model",
    ),
    err.insufficientMemory ? err.retryAfterSeconds : null,
  );
}

/** The lease `acquire` gives, its ModelLoadError as the client's answer. */
export async function leased(
  acquire: () => Promise<Lease<ServiceApp>>,
): Promise<Lease<ServiceApp>> {
  try {
    return await acquire();
  } catch (err) {
    throw err instanceof ModelLoadError ? loadError(err) : err;
  }
}

/**
 * Passes the request to a model's app, which answers, logs and counts it under the front's
 * request id; the lease is held until the answer's body has been sent or abandoned.
 */
export async function passOn(
  c: Context,
  records: RequestRecords,
  lease: Lease<ServiceApp>,
  forward: Request,
): Promise<Response> {
  let res: Response;
  try {
    const record = records.of(c.req.raw);
    if (record !== undefined) {
      forward.headers.set("x-request-id", record.id);
      record.passOn();
    }
    res = await lease.model.service.fetch(forward, c.env);
  } catch (err) {
    lease.release();
    throw err;
  }
  return releasedWhenDone(res, () => lease.release());
}

/**
 * A plain router's dispatch: a request naming another model that replicas advertise goes to
 * that model's app; no model, or one of the router's own names, goes on to its own routes.
 */
export function otherModelDispatch(o: {
  readonly isOwn: (asked: string) => boolean;
  /** The model an advertised name stands for; undefined when no replica serves it. */
  readonly resolve: (asked: string) => string | undefined;
  readonly acquire: (name: string) => Promise<Lease<ServiceApp>>;
  /** Every name served, for the 404. */
  readonly unknown: (asked: unknown) => ApiError;
}): (door: FrontDoor) => MiddlewareHandler {
  return (door) => async (c, next) => {
    const asked = await askedModel(c.req.raw, c.req.path, door.maxBodyBytes);
    // No model, or one that is no string: the router's own app answers (or says what is wrong).
    if (typeof asked.model !== "string" || o.isOwn(asked.model)) return await next();
    const name = o.resolve(asked.model);
    if (name === undefined) throw o.unknown(asked.model);
    const lease = await leased(() => o.acquire(name));
    const forward = rebuilt(c.req.raw, asked.text);
    return await passOn(c, door.records, lease, forward);
  };
}

/**
 * A completion of a front's own routes (a batch line): run on the app of the model `pick`
 * chooses from its body, and read whole while that model is held (a batch line never streams).
 */
export function dispatchedOpenAi(
  pick: (fields: Record<string, unknown> | undefined) => {
    readonly run: () => Promise<{ run: OpenAiHandler; release(): void }>;
    readonly body?: string;
  },
): OpenAiHandler {
  return async (req, kind, scope) => {
    const text = await req.text();
    const fields = objectBody(text);
    const chosen = pick(fields);
    const { run, release } = await chosen.run();
    try {
      const res = await run(rebuilt(req, chosen.body ?? text), kind, scope);
      return new Response(await res.arrayBuffer(), { status: res.status, headers: res.headers });
    } finally {
      release();
    }
  };
}

/** The completions of the model `acquire` leases (for dispatchedOpenAi), held until release(). */
export async function leasedOpenAi(
  name: string,
  acquire: () => Promise<Lease<ServiceApp>>,
): Promise<{ run: OpenAiHandler; release(): void }> {
  const lease = await leased(acquire);
  const run = lease.model.service.openAi;
  if (run === undefined) {
    lease.release();
    throw new Error(`the app of model "${name}" runs no completions`);
  }
  return { run, release: () => lease.release() };
}

/**
 * The response, with `done` called once its body has been sent or abandoned: a model stays
 * held (never unloaded) while a stream from it is being read.
 */
export function releasedWhenDone(res: Response, done: () => void): Response {
  if (res.body === null || res.status === 101) {
    done();
    return res;
  }
  const reader = res.body.getReader();
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const { value, done: end } = await reader.read();
        if (end) {
          controller.close();
          done();
        } else controller.enqueue(value);
      } catch (e) {
        done();
        controller.error(e);
      }
    },
    cancel(reason) {
      done();
      return reader.cancel(reason);
    },
  });
  return new Response(body, {
    status: res.status,
    statusText: res.statusText,
    headers: res.headers,
  });
}
