import { doneEvent } from "../core/done_event.ts";
import type { GenerationEvent, GenerationRequest } from "../core/generation.ts";
import type { LogitControls } from "../core/logit_controls.ts";
import type { Generate } from "./messages.ts";
import type { RemoteStream } from "./remote_stream.ts";
import { avoidsReplica, type StreamLoss } from "./stream_loss.ts";

type ErrorEvent = Extract<GenerationEvent, { type: "error" }>;

/** How one attempt on one replica ended: the generation is over, or the stream was lost. */
export type AttemptEnd =
  | { readonly kind: "final" }
  | { readonly kind: "lost"; readonly loss: StreamLoss };

/** Why no replica takes work now (chooseReplica's answer), as a client is told. */
export const NO_REPLICA = {
  overloaded: "Every replica is at its request limit; retry shortly",
  none: "No replica is available; retry shortly",
} as const;

/** The error after work lost with its replica found no other one within `waitMs`. */
export function notTakenOver(what: "generation" | "embedding", waitMs: number): string {
  return `The replica serving this ${what} was lost and no other one took it over within ${
    waitMs / 1000
  } s`;
}

/** What a Generate message carries besides its envelope (stream id, reply subject, credit). */
export type GenerateBody = Omit<Generate, "type" | "stream" | "replyTo" | "credit">;

/**
 * One generation across the replicas it runs on. It keeps every token id delivered to the
 * client; each attempt sends prompt + those ids with the same seed and max_tokens less what
 * was delivered. The sampler draws from (seed, position) and the position of the next token
 * is unchanged, so the continuation is the one the lost replica would have produced: the
 * client's tokens are the uninterrupted run's, none repeated, none missing. Stop strings stay
 * exact too: a replica never sends text that could begin a stop string (it holds such text
 * back with its ids), so what was delivered holds no partial match.
 */
export class Failover {
  readonly promptIds: readonly number[];
  /** Token ids delivered to the client, over every attempt. */
  readonly delivered: number[] = [];
  /** Replicas the next attempt avoids (refused it, or stopped making progress). */
  readonly avoid = new Set<string>();
  /** Every attempt lost so far, in order. */
  readonly losses: StreamLoss[] = [];
  readonly #req: GenerationRequest;
  readonly #t0: number;
  #started = false;
  #firstTokenAt: number | undefined;
  #refusal: ErrorEvent | undefined;
  #waitingSince: number | undefined;

  /** `model`: the model a router by model routes, named in each generate. */
  constructor(
    req: GenerationRequest,
    promptIds: readonly number[],
    t0 = performance.now(),
    readonly model?: string,
  ) {
    this.#req = req;
    this.promptIds = promptIds;
    this.#t0 = t0;
  }

  /** Tokens still to generate. */
  get left(): number {
    return this.#req.maxTokens - this.delivered.length;
  }

  /** Whether the client was told the generation started (a loss now is mid-stream). */
  get started(): boolean {
    return this.#started;
  }

  /** The next attempt's prompt: the prompt and every token delivered. */
  prompt(): number[] {
    return this.delivered.length === 0
      ? [...this.promptIds]
      : [...this.promptIds, ...this.delivered];
  }

  /** The next attempt's request, resuming after what was delivered. */
  request(): GenerateBody {
    const req = this.#req;
    const n = this.delivered.length;
    return {
      prompt: this.prompt(),
      maxTokens: this.left,
      sampling: req.sampling,
      stop: [...req.stop],
      stopTokenIds: req.stopTokenIds === undefined ? undefined : [...req.stopTokenIds],
      ...(req.ignoreEos ? { ignoreEos: true } : {}),
      ...(req.controls !== undefined ? { controls: wireControls(req.controls) } : {}),
      ...(n > 0 ? { generated: (req.generated ?? 0) + n } : {}),
      ...(req.topLogprobs ? { topLogprobs: req.topLogprobs } : {}),
      priority: req.priority,
      requestId: req.requestId,
      logprobs: req.logprobs ?? false,
      cacheScope: req.cacheScope,
      // A resumed attempt's answer is not the whole request's: it is never cached.
      ...(req.deterministic && n === 0 && !req.generated ? { deterministic: true } : {}),
      ...(req.noCache ? { noCache: true } : {}),
      ...(this.model === undefined ? {} : { model: this.model }),
      // The grammar must read what was delivered before it samples again.
      ...(req.constraint
        ? { constraint: req.constraint, constraintReplay: (req.constraintReplay ?? 0) + n }
        : {}),
    };
  }

  /**
   * No replica can take the next attempt. Before anything reached the client it is refused
   * at once (a clear refusal beats a long wait); mid-stream the client sees a pause while a
   * replica comes back, up to `waitMs`. Undefined: wait and choose again.
   */
  noReplica(why: "overloaded" | "none", waitMs: number): ErrorEvent | undefined {
    if (!this.#started) {
      return this.#refusal ?? { type: "error", code: "overloaded", message: NO_REPLICA[why] };
    }
    this.#waitingSince ??= performance.now();
    if (performance.now() - this.#waitingSince > waitMs) {
      return { type: "error", code: "internal", message: notTakenOver("generation", waitMs) };
    }
    // Avoided replicas get another chance once none is left.
    this.avoid.clear();
    return undefined;
  }

  /** A replica took the next attempt. */
  chosen(): void {
    this.#waitingSince = undefined;
  }

  /** Records a lost attempt; a replica that looks alive but is not is avoided next. */
  lost(loss: StreamLoss): void {
    this.losses.push(loss);
    if (avoidsReplica(loss)) this.avoid.add(loss.replica);
  }

  /**
   * The client's events from one attempt's stream, returning how the attempt ended. Tokens
   * the replica made after the client left are dropped (usage counts none of them).
   */
  async *attempt(
    stream: RemoteStream,
    signal: AbortSignal,
  ): AsyncGenerator<GenerationEvent, AttemptEnd> {
    const before = this.delivered.length;
    for (;;) {
      const r = await stream.read();
      if (r.kind === "lost") return { kind: "lost", loss: r.loss };
      const ev = r.event;
      if (ev.type === "started") {
        if (!this.#started) {
          this.#started = true;
          yield { type: "started", promptTokens: this.promptIds.length };
        }
      } else if (ev.type === "token") {
        if (signal.aborted) continue;
        this.delivered.push(...ev.ids);
        this.#firstTokenAt ??= performance.now();
        yield ev;
      } else if (ev.type === "done") {
        // The times this router's client saw, so that they add up (ttft = queued + prefill,
        // total = ttft + decode): the replica's prefill, and everything before it (routing,
        // the replica's queue, a failover) as queued.
        const end = performance.now();
        const firstToken = this.#firstTokenAt ?? end;
        const scheduled = Math.max(this.#t0, firstToken - ev.timings.prefillMs);
        yield doneEvent(
          ev.finishReason,
          {
            promptTokens: this.promptIds.length,
            completionTokens: ev.finishReason === "cancelled" || signal.aborted
              ? this.delivered.length
              : before + ev.usage.completionTokens,
            cachedTokens: before === 0 ? ev.usage.cachedTokens : 0,
          },
          { start: this.#t0, scheduled, firstToken, end },
          // A replay of the replica's result cache, unless earlier attempts generated a part.
          before === 0 ? ev.cached : undefined,
          ev.stopString,
        );
        return { kind: "final" };
      } else {
        if (!this.#started && (ev.code === "overloaded" || ev.code === "draining")) {
          // Refused before it began: another replica may take it.
          this.#refusal = { ...ev, code: "overloaded" };
          return {
            kind: "lost",
            loss: { kind: "refused", replica: stream.replica, code: ev.code },
          };
        }
        yield ev;
        return { kind: "final" };
      }
    }
  }

  /** The router's own final event: the client left, or max_tokens were all delivered. */
  finish(reason: "cancelled" | "length"): GenerationEvent {
    // A router cannot see a replica's queue: the wait for the first token counts as prefill.
    return doneEvent(reason, {
      promptTokens: this.promptIds.length,
      completionTokens: this.delivered.length,
      cachedTokens: 0,
    }, {
      start: this.#t0,
      scheduled: this.#t0,
      ...(this.#firstTokenAt === undefined ? {} : { firstToken: this.#firstTokenAt }),
    });
  }
}

/** GenerationRequest.controls as the Generate message carries them. */
function wireControls(c: LogitControls): NonNullable<Generate["controls"]> {
  const { logitBias, ...rest } = c;
  return logitBias === undefined
    ? rest
    : { ...rest, logitBias: logitBias.map(([id, b]) => [id, b] as [number, number]) };
}
