/**
 * A bounded, closeable, multi-producer multi-consumer channel: the mailbox every actor loops
 * over. A full channel makes `send` wait (backpressure); a closed one lets receivers drain
 * what is buffered and then end, while sending to it throws {@link ChannelClosedError}.
 */

/** Thrown by `send`/`trySend` on a closed channel, and by a `send` still waiting when it closes. */
export class ChannelClosedError extends Error {
  override name = "ChannelClosedError";
  constructor(message = "Cannot send: the channel is closed") {
    super(message);
  }
}

interface WaitingSender<T> {
  value: T;
  resolve: () => void;
  reject: (e: Error) => void;
}

/** A FIFO queue with O(1) amortised shift (Array.prototype.shift is O(n) on large arrays). */
class Queue<T> {
  #items: (T | undefined)[] = [];
  #head = 0;

  get length(): number {
    return this.#items.length - this.#head;
  }

  push(item: T): void {
    this.#items.push(item);
  }

  shift(): T | undefined {
    if (this.#head >= this.#items.length) return undefined;
    const item = this.#items[this.#head];
    this.#items[this.#head++] = undefined;
    if (this.#head > 64 && this.#head * 2 > this.#items.length) {
      this.#items = this.#items.slice(this.#head);
      this.#head = 0;
    }
    return item;
  }

  drain(): T[] {
    const rest = this.#items.slice(this.#head) as T[];
    this.#items = [];
    this.#head = 0;
    return rest;
  }
}

/**
 * Bounded channel. Capacity 0 is a rendezvous: `send` resolves once a receiver has the value.
 * Capacity `Infinity` never blocks; use it only where the number of messages is bounded by
 * construction (say so at the call site).
 *
 * @example
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const ch = new Channel<number>(2);
 * // The producer waits whenever two items are unread.
 * const producer = (async () => {
 *   for (let i = 0; i < 5; i++) await ch.send(i);
 *   ch.close();
 * })();
 * const got: number[] = [];
 * for await (const n of ch) got.push(n);
 * await producer;
 * assertEquals(got, [0, 1, 2, 3, 4]);
 * ```
 */
export class Channel<T> implements AsyncIterable<T> {
  readonly capacity: number;
  #buffer = new Queue<T>();
  #senders = new Queue<WaitingSender<T>>();
  #receivers = new Queue<(r: IteratorResult<T, undefined>) => void>();
  #closed = false;

  constructor(capacity = 0) {
    if (!(capacity === Infinity || (Number.isInteger(capacity) && capacity >= 0))) {
      throw new RangeError(
        `Cannot create channel: capacity must be a non-negative integer or Infinity, received ${capacity}`,
      );
    }
    this.capacity = capacity;
  }

  /** True once close() was called (buffered values may still be waiting to be received). */
  get closed(): boolean {
    return this.#closed;
  }

  /** Number of values buffered and not yet received. */
  get size(): number {
    return this.#buffer.length;
  }

  /** Sends a value, waiting while the channel is full. Rejects with ChannelClosedError when closed. */
  send(value: T): Promise<void> {
    if (this.#closed) return Promise.reject(new ChannelClosedError());
    if (this.trySend(value)) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      this.#senders.push({ value, resolve, reject });
    });
  }

  /**
   * Sends without waiting: false when the channel is full (nothing sent).
   * Throws ChannelClosedError when closed.
   */
  trySend(value: T): boolean {
    if (this.#closed) throw new ChannelClosedError();
    const receiver = this.#receivers.shift();
    if (receiver) {
      receiver({ value, done: false });
      return true;
    }
    if (this.#buffer.length < this.capacity) {
      this.#buffer.push(value);
      return true;
    }
    return false;
  }

  /** Next value; `{done: true}` once the channel is closed and drained. */
  receive(): Promise<IteratorResult<T, undefined>> {
    const now = this.tryReceive();
    if (now) return Promise.resolve(now);
    return new Promise((resolve) => this.#receivers.push(resolve));
  }

  /** Next value if one is ready, `{done: true}` if closed and drained, undefined otherwise. */
  tryReceive(): IteratorResult<T, undefined> | undefined {
    if (this.#buffer.length > 0) {
      const value = this.#buffer.shift() as T;
      // A slot opened: the longest-waiting sender moves into the buffer.
      const sender = this.#senders.shift();
      if (sender) {
        this.#buffer.push(sender.value);
        sender.resolve();
      }
      return { value, done: false };
    }
    const sender = this.#senders.shift();
    if (sender) {
      sender.resolve();
      return { value: sender.value, done: false };
    }
    if (this.#closed) return { value: undefined, done: true };
    return undefined;
  }

  /**
   * Closes the channel (idempotent). Buffered values stay receivable; waiting receivers end;
   * senders still waiting for room are rejected with ChannelClosedError, their values dropped.
   */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const receiver of this.#receivers.drain()) receiver({ value: undefined, done: true });
    for (const sender of this.#senders.drain()) {
      sender.reject(
        new ChannelClosedError("Cannot send: the channel was closed while waiting for room"),
      );
    }
  }

  /** Iterates until closed and drained. Leaving the loop early does not close the channel. */
  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    while (true) {
      const r = await this.receive();
      if (r.done) return;
      yield r.value;
    }
  }
}
