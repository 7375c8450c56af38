import type { GenerationEvent } from "../core/generation.ts";
import type { StreamLoss } from "./stream_loss.ts";

/** What a remote stream reads next: an event, or the news that the stream is lost. */
export type StreamRead =
  | { readonly kind: "event"; readonly event: GenerationEvent }
  | { readonly kind: "lost"; readonly loss: StreamLoss };

export interface RemoteStreamOptions {
  readonly id: string;
  readonly replica: string;
  /** Frames the replica may send ahead of what the consumer took. */
  readonly window: number;
  /** Sends a cumulative credit grant (frames with seq < upTo may come). */
  readonly sendCredit: (upTo: number) => void;
  readonly now?: () => number;
}

/**
 * The router's end of one attempt at a generation on one replica. Frames arrive numbered; a
 * gap (messages lost across a NATS reconnect) or silence beyond the liveness bound makes the
 * stream "lost", and the router fails over. Credit is granted as the consumer takes events, so
 * a slow client slows the replica's sequence instead of filling the router's memory.
 */
export class RemoteStream {
  readonly id: string;
  readonly replica: string;
  readonly openedAt: number;
  /** Last frame, or last heartbeat listing this stream. */
  lastActivity: number;
  /**
   * Last frame (or the opening): a replica that lists the stream in every heartbeat but sends
   * nothing (a hung engine step, frames lost in a reconnect) is seen by this alone.
   */
  lastFrameAt: number;
  /** The consumer's last look at its credit (resent when the stream is quiet). */
  lastGrantAt: number;
  #queue: GenerationEvent[] = [];
  #nextSeq = 0;
  #consumed = 0;
  #granted: number;
  #lost: StreamLoss | undefined;
  #ended = false;
  #wake: (() => void) | undefined;
  readonly #window: number;
  readonly #sendCredit: (upTo: number) => void;
  readonly #now: () => number;

  constructor(opts: RemoteStreamOptions) {
    this.id = opts.id;
    this.replica = opts.replica;
    this.#window = opts.window;
    this.#granted = opts.window;
    this.#sendCredit = opts.sendCredit;
    this.#now = opts.now ?? (() => performance.now());
    this.openedAt =
      this.lastActivity =
      this.lastFrameAt =
      this.lastGrantAt =
        this.#now();
  }

  get lost(): boolean {
    return this.#lost !== undefined;
  }

  /** True once the final event (done or error) arrived. */
  get ended(): boolean {
    return this.#ended;
  }

  onFrame(seq: number, event: GenerationEvent): void {
    if (this.#lost !== undefined || this.#ended) return;
    if (seq !== this.#nextSeq) {
      this.lose({ kind: "frames_lost", replica: this.replica, seq, expected: this.#nextSeq });
      return;
    }
    this.#nextSeq++;
    this.lastActivity = this.lastFrameAt = this.#now();
    this.#queue.push(event);
    if (event.type === "done" || event.type === "error") this.#ended = true;
    this.#wakeUp();
  }

  /** A heartbeat of its replica lists it: the replica still holds it. */
  markAlive(): void {
    this.lastActivity = this.#now();
  }

  lose(loss: StreamLoss): void {
    if (this.#lost !== undefined || this.#ended) return;
    this.#lost = loss;
    this.#wakeUp();
  }

  /** The seq of the next frame this end waits for. */
  get nextSeq(): number {
    return this.#nextSeq;
  }

  /**
   * Sends the current grant again, with the next frame expected: a lost credit message would
   * stall the stream for good, and a replica that sent frames which never arrived (lost in a
   * reconnect) learns so from `next` and gives the stream up, instead of waiting for credit
   * the same `upTo` never gives.
   */
  regrant(): void {
    this.lastGrantAt = this.#now();
    this.#sendCredit(this.#granted);
  }

  /** The next event; events that arrived before a loss are still delivered first. */
  async read(): Promise<StreamRead> {
    while (this.#queue.length === 0 && this.#lost === undefined) {
      await new Promise<void>((resolve) => this.#wake = resolve);
    }
    const event = this.#queue.shift();
    if (event === undefined) return { kind: "lost", loss: this.#lost! };
    this.#consumed++;
    const upTo = this.#consumed + this.#window;
    if (!this.#ended && upTo - this.#granted >= this.#window / 2) {
      this.#granted = upTo;
      this.lastGrantAt = this.#now();
      this.#sendCredit(upTo);
    }
    return { kind: "event", event };
  }

  #wakeUp(): void {
    const w = this.#wake;
    this.#wake = undefined;
    w?.();
  }
}
