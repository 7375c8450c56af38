/**
 * Every message between a pipeline head and its stages, validated with zod on receipt (a peer
 * is an external input like any client). Over NATS: a stage's announcement and the head's
 * attach request with its answer. Over the direct TCP link (frames of binary_frame.ts): the
 * head's hello, steps and releases, and the stage's answers.
 */
import { z } from "zod";
import { SamplingSchema, SubjectToken } from "./messages.ts";
import { MAX_TOP_LOGPROBS } from "../engine/top_logprobs.ts";

const int = z.number().int();
const nonNegative = int.nonnegative();
/** Bounds on what one step may list (the engine checks its own, smaller, limits after). */
const MAX_SEQS = 4096;
const MAX_ROWS = 1 << 20;

/**
 * The link's heartbeat: the head pings each stage this often, and declares a stage that left
 * this many pings in a row unanswered dead (it hangs: stopped, swapping, deadlocked). A stage
 * answers pings between steps' work (its engine computes on worker threads), so a dead stage
 * is noticed within (misses + 1) × interval of its last answer.
 */
export const STAGE_HEARTBEAT_MS = 1000;
export const STAGE_HEARTBEAT_MISSES = 2;

export const LayerRangeSchema = z.strictObject({ start: nonNegative, end: nonNegative });
/** A tensor-parallel rank of a group (kernels/wasm/tp_shard.ts); absent for a pipeline stage. */
export const TpRankSchema = z.strictObject({ rank: nonNegative, size: int.min(1).max(256) });
/** Most ranks a gather names. */
const MAX_RANKS = 256;

/** Stage → everyone, on subjects.stages, every heartbeat: who it is and where its link is. */
export const StageAnnouncementSchema = z.strictObject({
  type: z.literal("stage"),
  id: SubjectToken,
  /** modelIdentity() of its file and context (lib/cluster/model_identity.ts). */
  model: z.string().max(256),
  layers: LayerRangeSchema,
  nLayers: nonNegative,
  tp: TpRankSchema.optional(),
  host: z.string().max(256),
  port: int.min(1).max(65535),
});
export type StageAnnouncement = z.infer<typeof StageAnnouncementSchema>;

const KvSchema = z.strictObject({ numBlocks: int.min(1), blockSize: int.min(1) });
const LimitsSchema = z.strictObject({ maxSeqs: int.min(1), maxBatchTokens: int.min(1) });

/** Head → one stage (subjects.stage(id)): build your engine for this geometry, for me. */
export const StageAttachSchema = z.strictObject({
  type: z.literal("attach"),
  model: z.string().max(256),
  layers: LayerRangeSchema,
  tp: TpRankSchema.optional(),
  kv: KvSchema,
  limits: LimitsSchema,
  /** The context the head serves (its KV plan may have shortened the file's): the engine's. */
  contextLength: int.min(1),
});
export type StageAttach = z.infer<typeof StageAttachSchema>;

/** The stage's answer: the ticket its TCP link takes in the hello, or why not. */
export const StageAttachReplySchema = z.discriminatedUnion("type", [
  z.strictObject({ type: z.literal("attached"), ticket: z.string().min(16).max(128) }),
  z.strictObject({ type: z.literal("refused"), message: z.string().max(4096) }),
]);
export type StageAttachReply = z.infer<typeof StageAttachReplySchema>;

const AdjustSchema = z.strictObject({
  ids: z.instanceof(Int32Array),
  bias: z.instanceof(Float32Array),
  penalty: z.instanceof(Float32Array),
  subtract: z.instanceof(Float32Array),
});

export const SeqInputSchema = z.strictObject({
  seqId: int,
  tokens: z.array(nonNegative).max(MAX_ROWS),
  useLastSampled: z.boolean().optional(),
  startPos: nonNegative,
  blockTable: z.array(nonNegative).max(MAX_ROWS),
  sample: z.boolean(),
  sampling: SamplingSchema,
  adjust: AdjustSchema.optional(),
  topLogprobs: int.min(0).max(MAX_TOP_LOGPROBS).optional(),
  tokenMask: z.instanceof(Uint32Array).optional(),
  hidden: z.enum(["all", "last"]).optional(),
});

export const StepPlanSchema = z.strictObject({
  stepId: int,
  seqs: z.array(SeqInputSchema).max(MAX_SEQS),
  returnLogits: z.boolean().optional(),
  kvCopies: z.array(z.tuple([nonNegative, nonNegative])).max(MAX_ROWS).optional(),
});

/** Head → stage over the link, in order. */
export const LinkRequestSchema = z.discriminatedUnion("type", [
  z.strictObject({ type: z.literal("hello"), ticket: z.string().max(128) }),
  z.strictObject({
    type: z.literal("step"),
    plan: StepPlanSchema,
    /** The residual rows of the stage before (absent for the first stage). */
    input: z.instanceof(Float32Array).optional(),
  }),
  z.strictObject({ type: z.literal("release"), seqId: int }),
  /** Every rank's columns of the rank's current gather (its own slot empty: it has them). */
  z.strictObject({
    type: z.literal("gather"),
    parts: z.array(z.instanceof(Float32Array)).max(MAX_RANKS),
  }),
  z.strictObject({ type: z.literal("ping"), id: nonNegative }),
]);
export type LinkRequest = z.infer<typeof LinkRequestSchema>;

const SampledSchema = z.strictObject({
  seqId: int,
  token: nonNegative,
  logprob: z.number(),
  logits: z.instanceof(Float32Array).optional(),
  top: z.strictObject({ ids: z.array(nonNegative), logprobs: z.array(z.number()) }).optional(),
});

/**
 * Stage → head over the link: one answer per hello and per step, in order; a pong answers a
 * ping at once, between them.
 */
export const LinkReplySchema = z.discriminatedUnion("type", [
  z.strictObject({ type: z.literal("welcome"), layers: LayerRangeSchema }),
  z.strictObject({ type: z.literal("rows"), stepId: int, rows: z.instanceof(Float32Array) }),
  z.strictObject({
    type: z.literal("result"),
    result: z.strictObject({
      stepId: int,
      sampled: z.array(SampledSchema),
      hidden: z.array(z.strictObject({
        seqId: int,
        startPos: nonNegative,
        rows: z.instanceof(Float32Array),
      })).optional(),
    }),
  }),
  z.strictObject({ type: z.literal("error"), stepId: int.optional(), message: z.string() }),
  /** A tensor-parallel rank's columns of its next gather, sent while its step runs. */
  z.strictObject({ type: z.literal("gather"), cols: z.instanceof(Float32Array) }),
  z.strictObject({ type: z.literal("pong"), id: nonNegative }),
]);
export type LinkReply = z.infer<typeof LinkReplySchema>;

/** Parses `value` with `schema`, or throws naming the message and zod's first problems. */
export function parseMessage<T>(schema: z.ZodType<T>, value: unknown, what: string): T {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const issues = r.error.issues.slice(0, 3).map((i) =>
    `${i.path.join(".") || "(root)"}: ${i.message}`
  );
  throw new Error(`Invalid ${what}: ${issues.join("; ")}`);
}
