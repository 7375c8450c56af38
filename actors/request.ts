import { doneEvent } from "../lib/core/done_event.ts";
import type { FinishReason, GenerationEvent, GenerationRequest } from "../lib/core/generation.ts";
import { StopMatcher } from "../lib/core/stop_strings.ts";
import type { TopLogprobs } from "../lib/engine/top_logprobs.ts";
import { Channel, ChannelClosedError } from "./channel.ts";
import type { OutputConstraint } from "../lib/grammar/output_constraint.ts";
import type { TokenConstraint } from "../lib/grammar/token_constraint.ts";
import { ConstraintError, GrammarUnavailableError } from "../lib/grammar/constraint_error.ts";
import type { RequestMsg, SchedulerMsg, SeqEvent } from "./messages.ts";
import { SEQ_EVENTS_BESIDE_TOKENS } from "../lib/core/seq_events.ts";
import { DRAINING_EVENT } from "../lib/core/draining.ts";

/** What the request actor needs of a tokenizer (lib/tokenizer/tokenizer.ts's Tokenizer fits). */
export interface TextCodec {
  readonly bosId: number;
  /**
   * Every id that ends a generation (EOS, end-of-turn tokens, and for a Tokenizer BOS):
   * sampling one stops it unless the request says ignore_eos.
   */
  readonly endIds: ReadonlySet<number>;
  /** Streams ids to text, never splitting a UTF-8 character; afterBos: the ids follow a BOS. */
  createDecoder(opts?: { afterBos?: boolean }): { push(id: number): string; flush(): string };
}

/** Where the scheduler lives, as a request actor sees it. */
export interface SchedulerHandle {
  readonly mailbox: Channel<SchedulerMsg>;
  nextSeqId(): number;
}

/** The client side: send waits while the client is slow, and throws once it is gone. */
export interface GenerationSink {
  send(event: GenerationEvent): Promise<void>;
  /** Sends without waiting; false when the client is behind (nothing sent). */
  trySend?(event: GenerationEvent): boolean;
}

export interface RequestActorOptions {
  /** Clock in milliseconds (default performance.now). */
  readonly now?: () => number;
  /** Compiles a request's output constraint (constrained decoding); absent: none is served. */
  readonly grammars?: ConstraintCompiler;
}

/** What the request actor needs to constrain a generation (lib/grammar's GrammarService). */
export interface ConstraintCompiler {
  /**
   * A fresh grammar state for one sequence, advanced over `replay`; throws ConstraintError (a
   * 400) or GrammarUnavailableError (a 503). `maxTokens` bounds what the constraint may demand;
   * `signal` fires when the client leaves (a compile only it waits for is ended).
   */
  constraint(
    c: OutputConstraint,
    replay: readonly number[],
    req?: { readonly maxTokens?: number; readonly signal?: AbortSignal },
  ): Promise<TokenConstraint>;
}

/**
 * The ids that end a generation, added here and nowhere else (every backend's work reaches the
 * core through a request actor): the vocabulary's end ids unless ignore_eos, then the client's
 * stop_token_ids.
 */
function endIds(codec: TextCodec, req: GenerationRequest): number[] {
  return [...new Set([...(req.ignoreEos ? [] : codec.endIds), ...(req.stopTokenIds ?? [])])];
}

/** Messages the client side posts to a request actor: abort and client-gone, each at most once. */
const CLIENT_MESSAGES = 2;

/**
 * A request actor's mailbox capacity: every event the scheduler can send for a sequence of
 * `maxTokens` (see SEQ_EVENTS_BESIDE_TOKENS) and the client's messages. Full means a bound is
 * broken; the generation then fails with an error naming the lost message, never silently.
 */
export function requestMailboxCapacity(maxTokens: number): number {
  return Math.max(0, maxTokens) + SEQ_EVENTS_BESIDE_TOKENS + CLIENT_MESSAGES;
}

/**
 * One generation, from prompt to `done`: tokenizes, submits to the scheduler, turns token ids
 * into text deltas, applies stop strings (holding back text that may begin one), and reports
 * finish reason, usage and timings. The only code that talks to the client.
 *
 * abort() (the caller cancelled) stops the sequence and ends with done("cancelled");
 * clientGone() (nobody is listening) stops it silently. A sink that throws counts as gone.
 */
export class RequestActor {
  readonly mailbox: Channel<RequestMsg>;
  #scheduler: SchedulerHandle;
  #codec: TextCodec;
  #req: GenerationRequest;
  #sink: GenerationSink;
  #now: () => number;
  #grammars: ConstraintCompiler | undefined;
  #seqId = -1;
  #ended = false;
  /** Client messages posted already (each is posted once). */
  #posted = new Set<"abort" | "client-gone">();
  /** Set when the mailbox refused a message: the generation fails with it. */
  #overflow: string | undefined;
  /** Fires on abort or client-gone: a grammar compile nobody else waits for is ended. */
  #left = new AbortController();

  constructor(
    scheduler: SchedulerHandle,
    codec: TextCodec,
    req: GenerationRequest,
    sink: GenerationSink,
    opts: RequestActorOptions = {},
  ) {
    this.#scheduler = scheduler;
    this.#codec = codec;
    this.#req = req;
    this.#sink = sink;
    this.#now = opts.now ?? (() => performance.now());
    this.#grammars = opts.grammars;
    // Bounded by construction, so the scheduler's replies never wait (see requestMailboxCapacity).
    this.mailbox = new Channel(requestMailboxCapacity(req.maxTokens));
  }

  /** True once the generation has ended (done or error sent, or the client left). */
  get ended(): boolean {
    return this.#ended;
  }

  /** The caller cancelled: free the sequence and end with done("cancelled"). */
  abort(): void {
    this.#postOnce("abort");
  }

  /** The client is gone: free the sequence; nothing more is sent. */
  clientGone(): void {
    this.#postOnce("client-gone");
  }

  #postOnce(type: "abort" | "client-gone"): void {
    if (this.#posted.has(type)) return;
    this.#posted.add(type);
    this.#left.abort(new Error(`the request was ${type === "abort" ? "cancelled" : "left"}`));
    this.#post({ type });
  }

  #post(msg: RequestMsg): void {
    if (this.mailbox.closed || this.mailbox.trySend(msg)) return;
    this.#overflow ??=
      `the request mailbox (capacity ${this.mailbox.capacity}) was full and lost a "${msg.type}" message`;
  }

  /** Runs the generation to its end. Never throws: failures become an `error` event. */
  async run(): Promise<void> {
    try {
      await this.#run();
    } catch (e) {
      await this.#emit({
        type: "error",
        code: "internal",
        message: `Generation failed: ${e instanceof Error ? e.message : e}`,
      });
      this.#stopSequence("client-gone");
    } finally {
      this.#ended = true;
      this.mailbox.close();
    }
  }

  async #run(): Promise<void> {
    const req = this.#req;
    const codec = this.#codec;
    const prompt = [...req.prompt];
    const t0 = this.#now();
    let constraint: TokenConstraint | undefined;
    if (req.constraint) {
      const replay = Math.min(req.constraintReplay ?? 0, prompt.length);
      try {
        if (!this.#grammars) {
          throw new ConstraintError(
            "Cannot constrain the output: this server has no grammar engine",
          );
        }
        constraint = await this.#grammars.constraint(
          req.constraint,
          prompt.slice(prompt.length - replay),
          { maxTokens: req.maxTokens, signal: this.#left.signal },
        );
      } catch (e) {
        if (this.#left.signal.aborted) {
          // Nobody waits for a compile the client left; a cancelled one still ends with done.
          if (!this.#posted.has("abort")) return;
          const usage = { promptTokens: prompt.length, completionTokens: 0, cachedTokens: 0 };
          await this.#emit(doneEvent("cancelled", usage, { start: t0, end: this.#now() }));
          return;
        }
        if (e instanceof GrammarUnavailableError) {
          await this.#emit({ type: "error", code: "overloaded", message: e.message });
          return;
        }
        if (!(e instanceof ConstraintError)) throw e;
        await this.#emit({ type: "error", code: "invalid_request", message: e.message });
        return;
      }
    }
    const seqId = this.#scheduler.nextSeqId();
    this.#seqId = seqId;
    const reply = (e: SeqEvent) => this.#post(e);
    try {
      await this.#scheduler.mailbox.send({
        type: "submit",
        seq: {
          seqId,
          prompt,
          maxTokens: req.maxTokens,
          sampling: req.sampling,
          stopTokenIds: endIds(codec, req),
          priority: req.priority,
          cacheScope: req.cacheScope,
          ...(req.controls !== undefined ? { controls: req.controls } : {}),
          ...(req.generated !== undefined ? { generated: req.generated } : {}),
          ...(req.topLogprobs ? { topLogprobs: req.topLogprobs } : {}),
          ...(constraint ? { constraint } : {}),
        },
        reply,
      });
    } catch (e) {
      constraint?.dispose();
      if (!(e instanceof ChannelClosedError)) throw e;
      await this.#emit(DRAINING_EVENT);
      return;
    }

    const decoder = codec.createDecoder({ afterBos: prompt.at(-1) === codec.bosId });
    const stops = new StopMatcher(req.stop);
    let tScheduled: number | undefined;
    let tFirst: number | undefined;
    let cachedTokens = 0;
    let generated = 0;
    // An id counts as sent only with all of its text: a router resubmits after the ids it was
    // sent (failover), so ids whose text the stop matcher still held were lost with that text
    // (", there was" came back as ",  was"). Text is therefore sent up to the end of the last
    // id it completes; `end` is where an id's text ends in the decoded text (null while the
    // decoder holds its bytes, e.g. half a UTF-8 character).
    let pending: Array<{ id: number; logprob: number; top?: TopLogprobs; end: number | null }> = [];
    let decodedLen = 0;
    let released = "";
    let sentLen = 0;
    const decode = (id: number, logprob: number, top?: TopLogprobs): string => {
      const piece = decoder.push(id);
      pending.push({ id, logprob, end: null, ...(top !== undefined ? { top } : {}) });
      if (piece.length > 0) {
        decodedLen += piece.length;
        for (const p of pending) p.end ??= decodedLen;
      }
      return piece;
    };

    /**
     * Sends what the stop matcher released, as far as whole ids go (`final`: all of it, with
     * every id left); false when the client is gone.
     */
    const emitText = async (text: string, final = false): Promise<boolean> => {
      released += text;
      let k = final ? pending.length : 0;
      let upTo = final ? sentLen + released.length : sentLen;
      if (!final) {
        const limit = sentLen + released.length;
        for (; k < pending.length; k++) {
          const end = pending[k]!.end;
          if (end === null || end > limit) break;
          upTo = end;
        }
      }
      if (k === 0 && !(final && released.length > 0)) return true;
      const out = released.slice(0, upTo - sentLen);
      released = released.slice(upTo - sentLen);
      sentLen = upTo;
      const sent = pending.slice(0, k);
      pending = pending.slice(k);
      return await this.#emit({
        type: "token",
        text: out,
        ids: sent.map((p) => p.id),
        logprob: sent.reduce((sum, p) => sum + p.logprob, 0),
        ...(sent[0]?.top !== undefined ? { top: sent[0].top } : {}),
      });
    };
    const done = async (reason: FinishReason, completionTokens: number): Promise<void> => {
      await this.#emit(doneEvent(
        reason,
        { promptTokens: prompt.length, completionTokens, cachedTokens },
        { start: t0, scheduled: tScheduled, firstToken: tFirst, end: this.#now() },
        undefined,
        reason === "stop" ? stops.matched : undefined,
      ));
    };

    for await (const msg of this.mailbox) {
      // A full mailbox is a broken bound, reported rather than streaming with a gap.
      if (this.#overflow) throw new Error(this.#overflow);
      switch (msg.type) {
        case "accepted":
          if (!await this.#emit({ type: "started", promptTokens: prompt.length })) {
            return this.#stopSequence("client-gone");
          }
          break;
        case "rejected":
        case "failed":
          await this.#emit({ type: "error", code: msg.code, message: msg.message });
          return;
        case "scheduled":
          tScheduled = this.#now();
          cachedTokens = msg.cachedTokens;
          break;
        case "token": {
          generated++;
          tFirst ??= this.#now();
          const out = stops.push(decode(msg.token, msg.logprob, msg.top));
          if (!await emitText(out.text, out.stopped)) return this.#stopSequence("client-gone");
          if (out.stopped) {
            this.#stopSequence("cancel");
            await done("stop", generated);
            return;
          }
          break;
        }
        case "finished": {
          const out = stops.push(decoder.flush());
          const text = out.stopped ? out.text : out.text + stops.flush();
          if (!await emitText(text, true)) return;
          await done(out.stopped ? "stop" : msg.reason, msg.completionTokens);
          return;
        }
        case "abort":
          this.#stopSequence("cancel");
          await done("cancelled", generated);
          return;
        case "client-gone":
          return this.#stopSequence("client-gone");
      }
    }
  }

  /**
   * Sends an event to the client; false (and nothing thrown) when the client is gone. While
   * the client is behind, the scheduler holds the sequence: the engine decodes nothing for a
   * client that does not read.
   */
  async #emit(event: GenerationEvent): Promise<boolean> {
    try {
      if (this.#sink.trySend?.(event)) return true;
      if (!this.#sink.trySend) {
        await this.#sink.send(event);
        return true;
      }
      this.#tellScheduler("hold");
      await this.#sink.send(event);
      this.#tellScheduler("resume");
      return true;
    } catch {
      return false;
    }
  }

  #tellScheduler(type: "hold" | "resume"): void {
    if (this.#seqId < 0) return;
    this.#scheduler.mailbox.send({ type, seqId: this.#seqId }).catch(() => {
      // The scheduler has stopped: nothing to hold any more.
    });
  }

  /** Asks the scheduler to drop the sequence; "cancel" is answered, which nobody reads any more. */
  #stopSequence(how: "cancel" | "client-gone"): void {
    if (this.#seqId < 0) return;
    this.#scheduler.mailbox.send({ type: how, seqId: this.#seqId }).catch(() => {
      // The scheduler has stopped: the sequence is gone with it.
    });
  }
}
