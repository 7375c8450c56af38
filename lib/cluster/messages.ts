/**
 * Every message that crosses NATS between routers and replicas, validated with zod on receipt
 * (a peer on the bus is an external input like any client). One discriminated union per
 * direction, all in this one module:
 *
 * - {@link ReplicaAnnouncement}: replica → everyone, on the heartbeat subject.
 * - {@link ReplicaRequest}: router → one replica (generate, embed, credit, cancel, info).
 * - {@link StreamFrame}: replica → the router that opened a stream or asked an embedding.
 * - {@link InfoReply}: replica → router, the answer to an info request.
 */
import { z } from "zod";
import { TokenizerWire } from "./tokenizer_wire.ts";
import { numberSchema, PARAM_FIELDS, PARAMS } from "../http/request_params.ts";
import { MAX_TOP_LOGPROBS } from "../engine/top_logprobs.ts";
import { type Pooling, POOLINGS } from "../model/pooling_type.ts";

const int = z.number().int();
const nonNegative = int.nonnegative();

/**
 * Bounds on what a peer's arrays may hold, checked before their elements: zod reports an issue
 * per bad element, and a 1 MB heartbeat of 100,000 bad hashes took 350–600 ms to parse.
 * A replica sends at most 4096 hashes.
 */
const MAX_HASHES = 8192;
const MAX_STREAMS = 65_536;

/**
 * One subject token (a replica or stream id): whatever a peer sends here becomes part of a
 * subject this process publishes on, and a space or a dot in it made the publish throw (a
 * heartbeat id with a space killed the router from its timer).
 */
export const SubjectToken = z.string().regex(/^[A-Za-z0-9_-]{1,128}$/, {
  error: "expected 1 to 128 of A-Z a-z 0-9 _ -",
});
/** A whole subject to publish on: tokens joined by dots. */
export const Subject = z.string().max(512).regex(/^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$/, {
  error: "expected dot-separated tokens of A-Z a-z 0-9 _ -",
});

/**
 * The sampling parameters with the public limits (lib/http/request_params.ts): a peer is held
 * to what a client may ask. The seed is the 32-bit one the router derived.
 */
export const SamplingSchema = z.object({
  temperature: PARAM_FIELDS.temperature,
  topK: PARAM_FIELDS.top_k,
  topP: PARAM_FIELDS.top_p,
  minP: PARAM_FIELDS.min_p,
  seed: int.min(0).max(0xffff_ffff),
});

/** GenerationRequest.controls on the wire (lib/core/logit_controls.ts), with the public limits. */
export const LogitControlsSchema = z.object({
  logitBias: z.array(z.tuple([nonNegative, numberSchema(PARAMS.logit_bias.limits.values)]))
    .max(1_000_000).optional(),
  presencePenalty: PARAM_FIELDS.presence_penalty.optional(),
  frequencyPenalty: PARAM_FIELDS.frequency_penalty.optional(),
  repetitionPenalty: PARAM_FIELDS.repetition_penalty.optional(),
  repeatLastN: PARAM_FIELDS.repeat_last_n.optional(),
  minTokens: PARAM_FIELDS.min_tokens.optional(),
});
/** GenerationRequest.constraint (lib/grammar/output_constraint.ts) on the wire. */
export const ConstraintSchema = z.discriminatedUnion("type", [
  z.strictObject({ type: z.literal("json_object") }),
  z.strictObject({ type: z.literal("json_schema"), schema: z.string() }),
  z.strictObject({ type: z.literal("grammar"), grammar: z.string() }),
  z.strictObject({ type: z.literal("json_schema_or_text"), schema: z.string() }),
]);

/** Load a replica reports about itself: what the router balances on. */
export const LoadSchema = z.object({
  running: nonNegative,
  waiting: nonNegative,
  /** Scheduler limits: running + waiting at maxRunning + maxWaiting means full. */
  maxRunning: nonNegative,
  maxWaiting: nonNegative,
  kvBlocksUsed: nonNegative,
  kvBlocksTotal: nonNegative,
  /** Streams it serves over NATS (all routers together). */
  streams: nonNegative,
  /** Prompt tokens looked up in its prefix cache, and found there. */
  prefixQueryTokens: nonNegative,
  prefixHitTokens: nonNegative,
});
export type Load = z.infer<typeof LoadSchema>;

/** Models a replica lists at most (every model it serves, loaded or not). */
const MAX_MODELS = 1024;
/** Aliases one model may list at most. */
const MAX_ALIASES = 64;

/**
 * One model of a replica serving several (`deno task start --nats URL --model a --model b`):
 * its name and identity, whether it is loaded there, and while loaded its own scheduler's load
 * and prefix-cache hashes (each model has its own engine, KV cache and scheduler).
 */
export const ReplicaModelSchema = z.object({
  name: z.string().max(256),
  /**
   * Further names a request may give for it (`--served-model-name alias=model`): routers
   * resolve them to `name`, which is what a generate names.
   */
  aliases: z.array(z.string().min(1).max(256)).max(MAX_ALIASES).optional(),
  /** See HeartbeatSchema.modelId. */
  modelId: z.string().max(256).optional(),
  phase: z.enum(["unloaded", "loading", "loaded"]),
  /** Its scheduler's load while loaded (the replica's limits apply to each model). */
  running: nonNegative.optional(),
  waiting: nonNegative.optional(),
  /** Chained hashes of its cached prefix blocks, while loaded. */
  hashes: z.array(int).max(MAX_HASHES).optional(),
});
export type ReplicaModel = z.infer<typeof ReplicaModelSchema>;

/**
 * The models list, its hashes counted before any element is parsed: all models together may
 * hold MAX_HASHES (zod's cost grows with the elements it checks, see MAX_HASHES).
 */
const ModelsField = z.preprocess((v, ctx) => {
  if (!Array.isArray(v) || v.length > MAX_MODELS) return v;
  let n = 0;
  for (const m of v) {
    const h = (m as { hashes?: unknown } | null)?.hashes;
    if (Array.isArray(h)) n += h.length;
  }
  if (n > MAX_HASHES) {
    ctx.addIssue({
      code: "custom",
      message: `more than ${MAX_HASHES} hashes in all models (${n})`,
    });
    return z.NEVER;
  }
  return v;
}, z.array(ReplicaModelSchema).max(MAX_MODELS));

export const HeartbeatSchema = z.object({
  type: z.literal("heartbeat"),
  replica: SubjectToken,
  /** Increases by one per heartbeat; a restarted replica gets a new id, not a reset counter. */
  beat: nonNegative,
  /** The replica's own period, so a router can tell a late beat from a slow one. */
  intervalMs: int.positive(),
  /**
   * Age of the load figures: the beat comes from a worker thread, the figures from the main
   * thread, which a long engine step can block. A router drops a replica stalled for long.
   */
  stalledMs: nonNegative,
  draining: z.boolean(),
  model: z.string(),
  /** A replica of one model: its further names (`--served-model-name` given more than once). */
  aliases: z.array(z.string().min(1).max(256)).max(MAX_ALIASES).optional(),
  /**
   * What the model is, not what it is called: file size, a hash of its first bytes and the
   * context. Two files with one stem (stories260K.bin at context 512 and .gguf at 128) shared
   * a rotation, and requests fit for one failed on the other.
   */
  modelId: z.string().max(256).optional(),
  load: LoadSchema,
  /** Prefix-cache summary: block size and chained hashes of cached blocks (newest last). */
  prefix: z.object({ blockSize: int.positive(), hashes: z.array(int).max(MAX_HASHES) }),
  /** Ids of the streams it is serving now: each router's per-stream liveness evidence. */
  streamIds: z.array(SubjectToken).max(MAX_STREAMS),
  /**
   * A replica serving several models lists each here (`model` is then its default model, the
   * one a request naming none gets, `load` its totals and `prefix.hashes` empty: each model's
   * hashes are in its entry). Absent from a replica of one model.
   */
  models: ModelsField.optional(),
});
export type Heartbeat = z.infer<typeof HeartbeatSchema>;

/**
 * The models a heartbeat says its replica serves: its `models` list, or the one model of a
 * replica that has no list (always loaded, with the beat's own load and hashes).
 */
export function servedModels(hb: Heartbeat): ReplicaModel[] {
  if (hb.models !== undefined) return hb.models;
  return [{
    name: hb.model,
    ...(hb.aliases === undefined ? {} : { aliases: hb.aliases }),
    ...(hb.modelId === undefined ? {} : { modelId: hb.modelId }),
    phase: "loaded",
    running: hb.load.running,
    waiting: hb.load.waiting,
    hashes: hb.prefix.hashes,
  }];
}

/** A replica's last word: it exits (sent after its drain, so routers drop it at once). */
export const GoodbyeSchema = z.object({ type: z.literal("goodbye"), replica: SubjectToken });

export const ReplicaAnnouncement = z.discriminatedUnion("type", [HeartbeatSchema, GoodbyeSchema]);
export type ReplicaAnnouncement = z.infer<typeof ReplicaAnnouncement>;

/**
 * Router → replica: run a generation from token ids. `generated` ids were produced by an
 * earlier attempt and are already at the end of `prompt` (failover): seeded draws continue at
 * the same positions, and the penalties and min_tokens count those ids as output.
 */
export const GenerateSchema = z.object({
  type: z.literal("generate"),
  stream: SubjectToken,
  /** Subject the frames go to. */
  replyTo: Subject,
  prompt: z.array(nonNegative).min(1),
  // The router's internal count (capped to the context, less what a failover delivered): a
  // model with a context over the public max_tokens limit may need more.
  maxTokens: int.positive(),
  sampling: SamplingSchema,
  stop: z.array(z.string()),
  stopTokenIds: z.array(nonNegative).optional(),
  ignoreEos: z.boolean().optional(),
  controls: LogitControlsSchema.optional(),
  /** The prompt's last `generated` ids are what earlier attempts delivered (failover). */
  generated: nonNegative.optional(),
  topLogprobs: PARAM_FIELDS.top_logprobs.optional(),
  priority: PARAM_FIELDS.priority,
  requestId: z.string(),
  logprobs: z.boolean(),
  /** Frames the replica may send before waiting for a credit message. */
  credit: int.positive(),
  /** The client's cache scope (GenerationRequest.cacheScope), if it has one. */
  cacheScope: z.string().max(128).optional(),
  /**
   * Greedy or explicitly seeded (GenerationRequest.deterministic): the replica's result cache
   * may answer it. Never set on a resumed attempt (`generated`).
   */
  deterministic: z.boolean().optional(),
  /** The client asked for no cached answer (`cache: false`). */
  noCache: z.boolean().optional(),
  /** Constrained decoding (GenerationRequest.constraint). */
  constraint: ConstraintSchema.optional(),
  /**
   * How many of the prompt's last ids were generated under `constraint` (failover): the
   * replica's grammar reads them before it samples, so the continuation is exact.
   */
  constraintReplay: nonNegative.optional(),
  /**
   * The model to run it on, for a replica serving several (which loads it first when it is not
   * loaded); absent: the replica's default model. A replica of one model refuses another name.
   */
  model: z.string().max(256).optional(),
});
export type Generate = z.infer<typeof GenerateSchema>;

/** Router → replica: frames with seq < upTo may be sent (cumulative, so a lost one is harmless). */
export const CreditSchema = z.object({
  type: z.literal("credit"),
  stream: SubjectToken,
  upTo: nonNegative,
  /** The seq the router waits for: below what the replica sent, frames were lost. */
  next: nonNegative.optional(),
});

/**
 * Router → replica: end a stream. "cancel" answers with done(cancelled); "gone" (the client
 * left, or the router gave the stream up) frees it silently.
 */
export const CancelSchema = z.object({
  type: z.literal("cancel"),
  stream: SubjectToken,
  how: z.enum(["cancel", "gone"]),
});

/**
 * Router → replica: one part of its info reply. A real vocabulary (Llama 3: 5.5 MiB as JSON,
 * Qwen: 4.2 MiB) is over nats-server's stock max_payload (1 MiB), so the reply travels in parts.
 */
export const InfoRequestSchema = z.object({
  type: z.literal("info"),
  part: nonNegative.default(0),
  /** Which model's facts (a replica serving several loads it to answer); absent: its default. */
  model: z.string().max(256).optional(),
});

/**
 * Router → replica: one input's embedding, as its /v1/embeddings computes it (pooled and
 * normalized by the replica's settings), answered by an {@link EmbeddingFrameSchema} on
 * `replyTo`. While it runs the replica lists `stream` in its heartbeats' streamIds, so a router
 * sees a lost replica as it sees a lost stream; a cancel naming `stream` ends it.
 */
export const EmbedSchema = z.object({
  type: z.literal("embed"),
  stream: SubjectToken,
  replyTo: Subject,
  input: z.array(nonNegative).min(1),
  priority: PARAM_FIELDS.priority,
  requestId: z.string().max(256),
  /** As GenerateSchema.model. */
  model: z.string().max(256).optional(),
});
export type Embed = z.infer<typeof EmbedSchema>;

export const ReplicaRequest = z.discriminatedUnion("type", [
  GenerateSchema,
  EmbedSchema,
  CreditSchema,
  CancelSchema,
  InfoRequestSchema,
]);
export type ReplicaRequest = z.infer<typeof ReplicaRequest>;

const UsageSchema = z.object({
  promptTokens: nonNegative,
  completionTokens: nonNegative,
  cachedTokens: nonNegative,
});

const TimingsSchema = z.object({
  queuedMs: z.number(),
  prefillMs: z.number(),
  timeToFirstTokenMs: z.number(),
  decodeMs: z.number(),
  totalMs: z.number(),
  decodeTokensPerSecond: z.number(),
});

/** What a replica's refusal or failure says (GenerationErrorCode, as it travels). */
const ErrorCodeSchema = z.enum([
  "context_length_exceeded",
  // A schema or grammar the replica could not compile: the client's 400.
  "invalid_request",
  "payload_too_large",
  "overloaded",
  "draining",
  "internal",
]);

/** The serving core's GenerationEvent, as it travels. */
export const GenerationEventSchema = z.discriminatedUnion("type", [
  z.object({ type: z.literal("started"), promptTokens: nonNegative }),
  z.object({
    type: z.literal("token"),
    text: z.string(),
    ids: z.array(nonNegative),
    // JSON has no -Infinity: a token with probability 0 under the raw logits travels as null.
    logprob: z.number().nullable().transform((v) => v ?? -Infinity),
    top: z.object({
      ids: z.array(nonNegative).max(MAX_TOP_LOGPROBS),
      logprobs: z.array(z.number().nullable().transform((v) => v ?? -Infinity))
        .max(MAX_TOP_LOGPROBS),
    }).optional(),
  }),
  z.object({
    type: z.literal("done"),
    finishReason: z.enum(["stop", "length", "cancelled"]),
    usage: UsageSchema,
    timings: TimingsSchema,
    stopString: z.string().optional(),
    /** Replayed from the replica's result cache (CacheHit), so the client is told so too. */
    cached: z.object({
      savedMs: z.number().nonnegative(),
      similar: z.object({ score: z.number(), matched: z.string().max(400) }).optional(),
    }).optional(),
  }),
  z.object({ type: z.literal("error"), code: ErrorCodeSchema, message: z.string() }),
]);

/** Replica → router: one event of a stream, numbered from 0 so a gap is seen. */
export const EventFrameSchema = z.object({
  type: z.literal("event"),
  stream: SubjectToken,
  seq: nonNegative,
  event: GenerationEventSchema,
});

/**
 * The longest vector a replica may send, in base64 characters: 65,536 float32 values, past any
 * model's hidden size.
 */
const MAX_VECTOR_BASE64 = Math.ceil((65_536 * 4) / 3) * 4;

/**
 * Replica → router: the answer to an {@link EmbedSchema}, its vector's float32 values as
 * little-endian bytes in base64 (exact, and a third of the size of JSON numbers), or why not.
 */
export const EmbeddingFrameSchema = z.object({
  type: z.literal("embedding"),
  stream: SubjectToken,
  outcome: z.discriminatedUnion("kind", [
    z.object({ kind: z.literal("vector"), data: z.string().max(MAX_VECTOR_BASE64) }),
    z.object({ kind: z.literal("error"), code: ErrorCodeSchema, message: z.string().max(4096) }),
    // It serves the model without embeddings (the WebGPU engine): another replica may have them.
    z.object({ kind: z.literal("unsupported"), message: z.string().max(4096) }),
  ]),
});
export type EmbeddingFrame = z.infer<typeof EmbeddingFrameSchema>;

export const StreamFrame = z.discriminatedUnion("type", [EventFrameSchema, EmbeddingFrameSchema]);
export type StreamFrame = z.infer<typeof StreamFrame>;

/** Replica → router: what a router needs to serve the public API without the model. */
export const InfoReply = z.object({
  type: z.literal("info"),
  replica: z.string(),
  modelName: z.string(),
  /** See HeartbeatSchema.modelId. */
  modelId: z.string().max(256).optional(),
  contextLength: int.positive(),
  vocabSize: int.positive(),
  bosToken: z.string(),
  eosToken: z.string(),
  chatTemplate: z.string().optional(),
  /**
   * Present where the model gives embeddings there (its engine returns hidden states): how its
   * vectors are pooled and normalized (--embd-normalize) and their length, so that a router
   * serves /v1/embeddings as the replica does.
   */
  embedding: z.object({
    pooling: z.enum(POOLINGS as unknown as [Pooling, ...Pooling[]]),
    normalize: z.number(),
    dimensions: int.positive().max(65_536),
  }).optional(),
  /** The prompt its /v1/rerank asks in (GenerationBackend.rerankPrompt), where not the default. */
  rerankPrompt: z.string().max(65_536).optional(),
  /** The vocabulary, so the router tokenizes exactly as the replicas do. */
  tokenizer: TokenizerWire,
});
export type InfoReply = z.infer<typeof InfoReply>;

/**
 * Replica → router: part `part` of `parts` of its {@link InfoReply} (JSON, `bytes` long in all),
 * base64-encoded so its size is known before it is sent.
 */
export const InfoPart = z.object({
  type: z.literal("info_part"),
  replica: z.string(),
  part: nonNegative,
  parts: int.positive(),
  bytes: nonNegative,
  data: z.string(),
});
export type InfoPart = z.infer<typeof InfoPart>;

/** Parses a message body or says what was wrong with it (for a log line; never thrown at a peer). */
export function decodeMessage<T extends z.ZodType>(
  schema: T,
  data: Uint8Array,
): { ok: true; value: z.infer<T> } | { ok: false; error: string } {
  let json: unknown;
  try {
    json = JSON.parse(new TextDecoder().decode(data));
  } catch (e) {
    return { ok: false, error: `not JSON: ${(e as Error).message}` };
  }
  const parsed = schema.safeParse(json);
  if (!parsed.success) {
    // A peer decides how many issues there are: name the first few, count the rest.
    const issues = parsed.error.issues;
    const named = issues.slice(0, 3).map((i) => `${i.path.join(".")}: ${i.message}`.slice(0, 200));
    const more = issues.length > 3 ? `; and ${issues.length - 3} more issues` : "";
    return { ok: false, error: named.join("; ") + more };
  }
  return { ok: true, value: parsed.data };
}

export function encodeMessage(value: unknown): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(value));
}
