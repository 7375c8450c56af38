/**
 * Tensor-parallel gathers over the stage links (kernels/wasm/tp_shard.ts's TpExchange): the
 * head's rank 0 is the hub. Each remote rank sends its columns of a gather as a `gather` reply
 * frame while its step runs; once the hub has every rank's, it sends each remote rank every
 * other rank's (a `gather` request frame) and goes on with its own.
 */
import type { TpExchange } from "../../kernels/wasm/tp_shard.ts";

/** Values that arrive in order, taken in order by whoever waits; fail() rejects the waiting. */
class Arrivals<T> {
  readonly #items: T[] = [];
  readonly #waiting: { resolve: (v: T) => void; reject: (e: Error) => void }[] = [];
  #failed: Error | undefined;

  push(v: T): void {
    const w = this.#waiting.shift();
    if (w) w.resolve(v);
    else this.#items.push(v);
  }

  next(): Promise<T> {
    if (this.#items.length > 0) return Promise.resolve(this.#items.shift()!);
    if (this.#failed) return Promise.reject(this.#failed);
    return new Promise((resolve, reject) => this.#waiting.push({ resolve, reject }));
  }

  fail(e: Error): void {
    this.#failed = e;
    for (const w of this.#waiting.splice(0)) w.reject(e);
  }
}

/** A remote rank's exchange: its columns out over the link, everyone's back from the hub. */
export class RankGather implements TpExchange {
  #send: ((cols: Float32Array) => void) | undefined;
  readonly #mine: Float32Array[] = [];
  readonly #back = new Arrivals<Float32Array[]>();

  constructor(readonly rank: number, readonly size: number) {}

  /** The link this rank's gathers now go over. */
  bind(send: (cols: Float32Array) => void): void {
    this.#send = send;
  }

  exchange(local: Float32Array): Promise<readonly Float32Array[]> {
    if (!this.#send) {
      return Promise.reject(
        new Error(`Tensor-parallel rank ${this.rank} cannot gather: no head is linked to it`),
      );
    }
    this.#mine.push(local);
    this.#send(local);
    return this.#back.next().then((parts) => {
      const own = this.#mine.shift()!;
      return parts.map((p, j) => (j === this.rank ? own : p));
    });
  }

  /** The hub's answer to the oldest gather still waiting. */
  deliver(parts: Float32Array[]): void {
    if (parts.length !== this.size) {
      throw new Error(
        `Invalid gather for tensor-parallel rank ${this.rank}: expected the columns of ` +
          `${this.size} ranks, received ${parts.length}`,
      );
    }
    this.#back.push(parts);
  }

  /** Ends every waiting gather with `e` (the link closed). */
  fail(e: Error): void {
    this.#back.fail(e);
  }
}

/** What the hub needs of a link to a remote rank. */
export interface GatherLink {
  /** Called with each gather's columns the remote rank sends. */
  onGather?: (cols: Float32Array) => void;
  /** Called once when the link is lost. */
  onLost?: (e: Error) => void;
  sendGather(parts: Float32Array[]): void;
}

/** Rank 0's exchange on the head: collects the remote ranks' columns, answers them all. */
export class HubGather implements TpExchange {
  #links: GatherLink[] = [];
  #arrivals: Arrivals<Float32Array>[] = [];

  /** The links to ranks 1.., in rank order. */
  attach(links: readonly GatherLink[]): void {
    this.#links = [...links];
    this.#arrivals = links.map((l) => {
      const a = new Arrivals<Float32Array>();
      l.onGather = (cols) => a.push(cols);
      l.onLost = (e) => a.fail(e);
      return a;
    });
  }

  /** Ends this and every later gather with `e` (a rank failed its step: the group is broken). */
  fail(e: Error): void {
    for (const a of this.#arrivals) a.fail(e);
  }

  async exchange(local: Float32Array): Promise<readonly Float32Array[]> {
    const remote = await Promise.all(this.#arrivals.map((a) => a.next()));
    const parts = [local, ...remote];
    this.#links.forEach((l, i) => {
      l.sendGather(parts.map((p, j) => (j === i + 1 ? new Float32Array(0) : p)));
    });
    return parts;
  }
}
