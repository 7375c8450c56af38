import type { Hono } from "hono";
import { z } from "zod";
import { encodeBase64 } from "@std/encoding/base64";
import type { GenerationBackend, Priority } from "../core/generation.ts";
import { type Embedder, EmbeddingError } from "../core/embedder.ts";
import { outsideVocabulary } from "../core/prompt_check.ts";
import { normalizeEmbedding } from "../engine/embedding_norm.ts";
import { readJsonBody } from "./body.ts";
import { ApiError, fromGenerationError } from "./errors.ts";
import { servedName } from "./openai_routes.ts";
import { parseWith } from "./validation.ts";
import { PARAM_FIELDS } from "./request_params.ts";

/** What one /v1/embeddings request may hold, and how many of its inputs run at once. */
export const EMBEDDING_LIMITS = {
  /** OpenAI's own limit on inputs per request. */
  maxInputs: 2048,
  /** Inputs of one request in the scheduler at once: one request never fills its queue. */
  concurrent: 16,
} as const;

const TokenIds = z.array(z.number().int().nonnegative()).min(1);

/** POST /v1/embeddings, OpenAI's shape. */
export const EmbeddingsBody = z.strictObject({
  model: z.string().nullish(),
  input: z.union([
    z.string(),
    z.array(z.string()).min(1),
    TokenIds,
    z.array(TokenIds).min(1),
  ]),
  encoding_format: z.enum(["float", "base64"]).default("float"),
  dimensions: z.number().int().positive().optional(),
  /** Accepted as OpenAI accepts it; no effect. */
  user: z.string().optional(),
  /** Ours, as on the completion routes: a batch line's inputs yield to interactive work. */
  priority: PARAM_FIELDS.priority.optional(),
});

/** What the routes that run the model over inputs (embeddings, rerank) need of the app. */
export interface EmbeddingsOptions {
  readonly backend: GenerationBackend;
  readonly maxBodyBytes: number;
  readonly servedModelNames: readonly string[];
}

/**
 * POST /v1/embeddings: each input's pooled hidden state (lib/engine/pooling.ts), computed by
 * the same scheduler as the generations and normalized as llama-server does; `dimensions`
 * keeps the first that many and normalizes again (Matryoshka-trained models allow it).
 * A request's inputs are one unit: all are answered, or the request fails with the first
 * error (the rest are cancelled).
 */
export function registerEmbeddingsRoute(app: Hono, o: EmbeddingsOptions): void {
  const handle = embeddingsHandler(o);
  app.post("/v1/embeddings", (c) => handle(c.req.raw));
}

/** POST /v1/embeddings's answer to a request, for the route and for batch lines. */
export function embeddingsHandler(o: EmbeddingsOptions): (req: Request) => Promise<Response> {
  return async (req) => {
    const b = parseWith(EmbeddingsBody, await readJsonBody(req, o.maxBodyBytes));
    const model = servedName(b.model, o.servedModelNames);
    const { vectors, promptTokens } = await embedInputs(
      o.backend,
      model,
      b.input,
      b.dimensions,
      req.signal,
      b.priority ?? "interactive",
    );
    return Response.json({
      object: "list",
      data: vectors.map((cut, index) => ({
        object: "embedding",
        index,
        embedding: b.encoding_format === "base64"
          ? encodeBase64(new Uint8Array(cut.buffer, cut.byteOffset, cut.byteLength))
          : Array.from(cut),
      })),
      model,
      usage: { prompt_tokens: promptTokens, total_tokens: promptTokens },
    });
  };
}

/**
 * Every input's embedding, cut to `dimensions` (and normalized again) where asked, with the
 * tokens embedded: the one path of /v1/embeddings and Ollama's /api/embed.
 */
export async function embedInputs(
  backend: GenerationBackend,
  model: string,
  input: z.output<typeof EmbeddingsBody>["input"],
  dimensions: number | undefined,
  signal: AbortSignal,
  priority: Priority = "interactive",
): Promise<{ vectors: Float32Array[]; promptTokens: number }> {
  const embedder = backend.embedder;
  if (!embedder) {
    throw new ApiError(
      "invalid_request",
      `The model "${model}" serves no embeddings here: the engine serving it returns no hidden states`,
      "model",
    );
  }
  const dims = dimensions ?? embedder.dimensions;
  if (dims > embedder.dimensions) {
    throw new ApiError(
      "invalid_request",
      `'dimensions' is ${dims}, but the model's embeddings have ${embedder.dimensions}`,
      "dimensions",
    );
  }
  const inputs = tokenized(input, backend);
  const vectors = await embedAll(embedder, inputs, signal, priority);
  return {
    vectors: vectors.map((v) =>
      dims < v.length ? normalizeEmbedding(v.slice(0, dims), embedder.normalize) : v
    ),
    promptTokens: inputs.reduce((n, ids) => n + ids.length, 0),
  };
}

/** Every input as token ids, each checked against the vocabulary and the context. */
function tokenized(input: z.output<typeof EmbeddingsBody>["input"], backend: GenerationBackend) {
  const list: (string | readonly number[])[] = typeof input === "string"
    ? [input]
    : typeof input[0] === "number"
    ? [input as number[]]
    : input as (string | number[])[];
  if (list.length > EMBEDDING_LIMITS.maxInputs) {
    throw new ApiError(
      "invalid_request",
      `'input' holds ${list.length} inputs; at most ${EMBEDDING_LIMITS.maxInputs} are taken in one request`,
      "input",
    );
  }
  return list.map((item, i) => {
    const param = list.length === 1 && !Array.isArray(input) ? "input" : `input[${i}]`;
    if (typeof item === "string") {
      const atLeast = backend.minTokens?.(item) ?? 0;
      if (atLeast > backend.contextLength) throw tooLong(param, atLeast, backend.contextLength);
    }
    const ids = typeof item === "string"
      ? backend.tokenize(item, { bos: true, special: false })
      : item;
    if (ids.length === 0) {
      throw new ApiError("invalid_request", `${param} is empty: it has no tokens to embed`, param);
    }
    if (ids.length > backend.contextLength) {
      throw tooLong(param, ids.length, backend.contextLength);
    }
    const bad = backend.vocabSize ? outsideVocabulary(ids, backend.vocabSize) : -1;
    if (bad >= 0) {
      throw new ApiError(
        "invalid_request",
        `${param}[${bad}] is token ${ids[bad]}, outside the vocabulary of ${backend.vocabSize} ids`,
        param,
      );
    }
    return ids;
  });
}

function tooLong(param: string, tokens: number, context: number): ApiError {
  return new ApiError(
    "context_length_exceeded",
    `${param} is ${tokens} tokens, past the model's context of ${context} tokens`,
    param,
  );
}

/**
 * Embeds every input, EMBEDDING_LIMITS.concurrent at a time, in input order. The first
 * failure cancels the rest and is the request's answer.
 */
async function embedAll(
  embedder: Embedder,
  inputs: readonly (readonly number[])[],
  clientSignal: AbortSignal,
  priority: Priority,
): Promise<Float32Array[]> {
  const stop = new AbortController();
  const signal = AbortSignal.any([stop.signal, clientSignal]);
  const out: Float32Array[] = new Array(inputs.length);
  let next = 0;
  const worker = async () => {
    while (next < inputs.length && !signal.aborted) {
      const i = next++;
      out[i] = await embedder.embed(inputs[i]!, signal, priority);
    }
  };
  const workers = Array.from(
    { length: Math.min(EMBEDDING_LIMITS.concurrent, inputs.length) },
    worker,
  );
  try {
    await Promise.all(workers);
  } catch (e) {
    stop.abort();
    await Promise.allSettled(workers);
    if (!(e instanceof EmbeddingError)) throw e;
    // Cancelled: the client left (nobody reads the answer) or a sibling input failed first.
    throw fromGenerationError(e.code === "cancelled" ? "internal" : e.code, e.message);
  }
  return out;
}
