import { GREEDY } from "../lib/engine/engine.ts";
import { Pooler, type Pooling } from "../lib/engine/pooling.ts";
import type { Priority } from "../lib/core/generation.ts";
import { Channel, ChannelClosedError } from "./channel.ts";
import { EmbeddingError } from "../lib/core/embedder.ts";
import type { SchedulerMsg, SeqEvent } from "./messages.ts";
import { SEQ_EVENTS_BESIDE_TOKENS } from "../lib/core/seq_events.ts";
import { DRAINING_MESSAGE } from "../lib/core/draining.ts";

/** What an embedding needs of the scheduler actor. */
export interface EmbeddingScheduler {
  readonly mailbox: Channel<SchedulerMsg>;
  nextSeqId(): number;
}

/** One input to embed. */
export interface EmbeddingJob {
  readonly prompt: readonly number[];
  readonly pooling: Pooling;
  readonly priority: Priority;
  /** The model's hidden size (config.dim). */
  readonly dim: number;
}

/**
 * Computes one pooled embedding (not normalized) as a prefill-only sequence of the shared
 * scheduler: batched with generations under the same token budget and priorities, its KV
 * blocks freed when its last chunk ran. Aborting `signal` cancels it. Throws EmbeddingError
 * when the scheduler refuses or fails it.
 */
export async function embedPrompt(
  scheduler: EmbeddingScheduler,
  job: EmbeddingJob,
  signal?: AbortSignal,
): Promise<Float32Array> {
  // Never full: at most one hidden event per prompt row, besides accepted/scheduled/finished.
  const events = new Channel<SeqEvent>(job.prompt.length + SEQ_EVENTS_BESIDE_TOKENS);
  const seqId = scheduler.nextSeqId();
  const onAbort = () => scheduler.mailbox.trySend({ type: "cancel", seqId });
  try {
    await scheduler.mailbox.send({
      type: "submit",
      seq: {
        seqId,
        prompt: job.prompt,
        maxTokens: 0,
        sampling: GREEDY,
        stopTokenIds: [],
        priority: job.priority,
        embed: job.pooling,
      },
      reply: (e) => events.trySend(e),
    });
  } catch (e) {
    if (!(e instanceof ChannelClosedError)) throw e;
    throw new EmbeddingError("draining", DRAINING_MESSAGE);
  }
  signal?.addEventListener("abort", onAbort, { once: true });
  if (signal?.aborted) onAbort();
  const pooler = new Pooler(job.pooling, job.dim);
  try {
    for await (const e of events) {
      switch (e.type) {
        case "hidden":
          pooler.add(e.states);
          break;
        case "rejected":
        case "failed":
          throw new EmbeddingError(e.code, e.message);
        case "finished":
          if (e.reason === "cancelled") {
            throw new EmbeddingError("cancelled", "Embedding cancelled");
          }
          return pooler.result();
      }
    }
    throw new EmbeddingError("internal", "Cannot embed: the scheduler stopped");
  } finally {
    signal?.removeEventListener("abort", onAbort);
    events.close();
  }
}
