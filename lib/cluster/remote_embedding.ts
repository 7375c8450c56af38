import type { EmbeddingFrame } from "./messages.ts";
import type { StreamLoss } from "./stream_loss.ts";

/** How one attempt at an embedding ended: the replica's answer, or the news it was lost. */
export type EmbeddingEnd =
  | { readonly kind: "answer"; readonly outcome: EmbeddingFrame["outcome"] }
  | { readonly kind: "lost"; readonly loss: StreamLoss };

/**
 * The router's end of one attempt at one input's embedding on one replica: a stream of one
 * frame. It is alive while the replica's heartbeats list it (as a generation's stream is), and
 * lost when they stop (the replica died), when the replica says goodbye, or when it sends
 * nothing for the progress bound; the router then asks another replica.
 */
export class RemoteEmbedding {
  readonly openedAt: number;
  /** The opening, or the last heartbeat listing it. */
  lastActivity: number;
  readonly ended: Promise<EmbeddingEnd>;
  #settle!: (end: EmbeddingEnd) => void;
  #done = false;

  constructor(readonly id: string, readonly replica: string, now = performance.now()) {
    this.openedAt = this.lastActivity = now;
    this.ended = new Promise((resolve) => this.#settle = resolve);
  }

  onAnswer(outcome: EmbeddingFrame["outcome"]): void {
    this.#end({ kind: "answer", outcome });
  }

  markAlive(now = performance.now()): void {
    this.lastActivity = now;
  }

  lose(loss: StreamLoss): void {
    this.#end({ kind: "lost", loss });
  }

  #end(end: EmbeddingEnd): void {
    if (this.#done) return;
    this.#done = true;
    this.#settle(end);
  }
}
