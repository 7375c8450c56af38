import type { ServerFrame } from "./protocol.ts";

/** The part of a WebSocket the writer needs (Deno's server socket, or a test double). */
export interface FrameSocket {
  send(text: string): void;
  /** Bytes queued but not yet written to the network. */
  readonly bufferedAmount: number;
  readonly isOpen: boolean;
  close(code: number, reason: string): void;
}

export interface WriterOptions {
  /** Above this many buffered bytes, senders wait. */
  readonly highWaterBytes: number;
  /** Senders resume once the buffer is back under this. */
  readonly lowWaterBytes: number;
  /** A client that stays congested this long is disconnected (its generations end). */
  readonly stallTimeoutMs: number;
  readonly pollMs?: number;
}

/** WebSocket close code sent to a client that stopped reading. */
export const CLOSE_TOO_SLOW = 1008;

/**
 * Sends frames on one socket with backpressure: after a send leaves more than the high-water
 * mark buffered, send() does not resolve until the buffer drains below the low-water mark.
 * Generation loops await send() before pulling the next event, so a slow reader pauses its
 * own generations instead of growing a queue. The WebSocket API has no "drain" event, hence
 * the polling of bufferedAmount while congested (only then).
 */
export class FrameWriter {
  #sock: FrameSocket;
  #opts: Required<WriterOptions>;
  #drained: Promise<boolean> | null = null;
  #timer: ReturnType<typeof setTimeout> | undefined;

  constructor(sock: FrameSocket, opts: WriterOptions) {
    this.#sock = sock;
    this.#opts = { pollMs: 5, ...opts };
  }

  get congested(): boolean {
    return this.#sock.bufferedAmount > this.#opts.highWaterBytes;
  }

  /**
   * Sends a frame and waits out congestion; false once the socket is closed. Frames sent
   * without waiting (error replies to a client that keeps sending but never reads) are capped
   * too: past four times the high-water mark the client is disconnected.
   */
  async send(frame: ServerFrame): Promise<boolean> {
    if (!this.#sock.isOpen) return false;
    this.#sock.send(JSON.stringify(frame));
    if (!this.congested) return true;
    const buffered = this.#sock.bufferedAmount;
    if (buffered > 4 * this.#opts.highWaterBytes) {
      this.#sock.close(CLOSE_TOO_SLOW, `client is not reading; ${buffered} bytes buffered`);
      return false;
    }
    return await this.#whenDrained();
  }

  /** Sends a frame unless the socket is congested or closed (for frames that may be dropped). */
  trySend(frame: ServerFrame): boolean {
    if (!this.#sock.isOpen || this.congested) return false;
    this.#sock.send(JSON.stringify(frame));
    return true;
  }

  /** Stops any pending poll (the socket is gone). */
  dispose(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  #whenDrained(): Promise<boolean> {
    if (this.#drained !== null) return this.#drained;
    const since = performance.now();
    this.#drained = new Promise<boolean>((resolve) => {
      const poll = () => {
        this.#timer = undefined;
        if (!this.#sock.isOpen) return resolve(false);
        if (this.#sock.bufferedAmount <= this.#opts.lowWaterBytes) return resolve(true);
        if (performance.now() - since > this.#opts.stallTimeoutMs) {
          this.#sock.close(
            CLOSE_TOO_SLOW,
            `client read nothing for ${this.#opts.stallTimeoutMs} ms`,
          );
          return resolve(false);
        }
        this.#timer = setTimeout(poll, this.#opts.pollMs);
      };
      poll();
    }).finally(() => {
      this.#drained = null;
    });
    return this.#drained;
  }
}
