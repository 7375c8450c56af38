/**
 * Test double: an in-process NATS server and its client connections, implementing the part of
 * the client the cluster code uses (BusConnection, lib/cluster/nats_connection.ts) with the
 * semantics it relies on:
 *
 * - publish routes at once, server side, to every subscription whose subject matches then
 *   (tokens, `*` and `>`); a subscription made later does not get it. Each connection gets its
 *   messages asynchronously (a later task, as from a socket) and in publish order. A publish
 *   on a closed connection, over max_payload or on an invalid subject throws, as the client's.
 * - subscribe's callback gets (null, msg); after unsubscribe() (or close()) nothing more is
 *   delivered, queued messages included.
 * - request() publishes with a reply inbox and resolves with the first answer; with no
 *   subscriber on the subject it rejects at once (the server's "no responders" status), and
 *   after `timeout` ms with a timeout error. msg.respond() publishes to the inbox.
 * - flush() resolves once everything this connection published before it was delivered.
 * - close() ends the connection: its subscriptions stop, its pending requests reject, it no
 *   longer publishes (a process that dies, as the server sees it).
 *
 * `tap` sees every message as the server routes it and may drop it: lost messages, a replica
 * whose frames stop, a network that splits.
 */
import type { BusConnection, BusMsg, BusSubscription } from "../lib/cluster/nats_connection.ts";

export interface TappedMessage {
  readonly from: FakeNatsConnection;
  readonly subject: string;
  readonly data: Uint8Array;
  readonly reply?: string;
}

/** Thrown by request() where the NATS client throws its "503" no-responders error. */
export class NoRespondersError extends Error {
  readonly code = "503";
  constructor(subject: string) {
    super(`no responders: ${subject}`);
    this.name = "NoRespondersError";
  }
}

export class RequestTimeoutError extends Error {
  readonly code = "TIMEOUT";
  constructor(subject: string, ms: number) {
    super(`TIMEOUT: no answer on ${subject} within ${ms} ms`);
    this.name = "TimeoutError";
  }
}

interface FakeSub {
  readonly conn: FakeNatsConnection;
  readonly subject: string;
  readonly callback: (err: Error | null, msg: BusMsg) => void;
  active: boolean;
}

const SUBJECT = /^[^\s.*>]+(\.[^\s.*>]+)*$/;
const PATTERN = /^([^\s.*>]+|\*)(\.([^\s.*>]+|\*))*(\.>)?$|^>$/;

function matches(pattern: string, subject: string): boolean {
  const p = pattern.split(".");
  const s = subject.split(".");
  for (let i = 0; i < p.length; i++) {
    if (p[i] === ">") return s.length > i;
    if (i >= s.length) return false;
    if (p[i] !== "*" && p[i] !== s[i]) return false;
  }
  return p.length === s.length;
}

export class FakeNatsServer {
  readonly maxPayload: number;
  /** Sees each message as it is routed; false drops it. */
  tap: ((m: TappedMessage) => boolean) | undefined;
  /** Messages routed (after the tap), for the tests' own checks. */
  routed = 0;
  readonly #subs = new Set<FakeSub>();
  #inbox = 0;

  constructor(opts: { maxPayload?: number } = {}) {
    this.maxPayload = opts.maxPayload ?? 1 << 20;
  }

  connect(name: string): FakeNatsConnection {
    return new FakeNatsConnection(this, name);
  }

  /** @internal */
  addSub(sub: FakeSub): void {
    this.#subs.add(sub);
  }

  /** @internal */
  removeSub(sub: FakeSub): void {
    sub.active = false;
    this.#subs.delete(sub);
  }

  /** @internal */
  newInbox(): string {
    return `_INBOX.fake${++this.#inbox}`;
  }

  /** @internal Routes one message; the number of subscriptions it went to. */
  route(m: TappedMessage): number {
    const targets = [...this.#subs].filter((s) => matches(s.subject, m.subject));
    if (this.tap !== undefined && !this.tap(m)) return targets.length;
    this.routed++;
    for (const sub of targets) sub.conn.enqueue(sub, m);
    return targets.length;
  }

  /** @internal Whether anyone listens on `subject` now. */
  hasListener(subject: string): boolean {
    for (const s of this.#subs) if (matches(s.subject, subject)) return true;
    return false;
  }
}

export class FakeNatsConnection implements BusConnection {
  readonly name: string;
  readonly info: { readonly max_payload: number };
  readonly #server: FakeNatsServer;
  readonly #subs = new Set<FakeSub>();
  readonly #queue: Array<{ sub: FakeSub; m: TappedMessage }> = [];
  readonly #pending = new Set<(e: Error) => void>();
  #scheduled = false;
  #closed = false;

  constructor(server: FakeNatsServer, name: string) {
    this.#server = server;
    this.name = name;
    this.info = { max_payload: server.maxPayload };
  }

  isClosed(): boolean {
    return this.#closed;
  }

  publish(subject: string, data: Uint8Array = new Uint8Array(), reply?: string): void {
    if (this.#closed) throw new Error("CONNECTION_CLOSED");
    if (!SUBJECT.test(subject)) throw new Error(`invalid subject: ${JSON.stringify(subject)}`);
    if (data.length > this.info.max_payload) {
      throw new Error(`MAX_PAYLOAD_EXCEEDED: ${data.length} > ${this.info.max_payload}`);
    }
    this.#server.route({ from: this, subject, data, ...(reply === undefined ? {} : { reply }) });
  }

  subscribe(
    subject: string,
    opts: { callback: (err: Error | null, msg: BusMsg) => void },
  ): BusSubscription {
    if (this.#closed) throw new Error("CONNECTION_CLOSED");
    if (!PATTERN.test(subject)) throw new Error(`invalid subject: ${JSON.stringify(subject)}`);
    const sub: FakeSub = { conn: this, subject, callback: opts.callback, active: true };
    this.#subs.add(sub);
    this.#server.addSub(sub);
    return {
      unsubscribe: () => {
        this.#subs.delete(sub);
        this.#server.removeSub(sub);
      },
    };
  }

  request(subject: string, data: Uint8Array, opts: { timeout: number }): Promise<BusMsg> {
    if (this.#closed) return Promise.reject(new Error("CONNECTION_CLOSED"));
    if (!this.#server.hasListener(subject)) {
      return Promise.reject(new NoRespondersError(subject));
    }
    return new Promise<BusMsg>((resolve, reject) => {
      const inbox = this.#server.newInbox();
      let sub: BusSubscription | undefined = undefined;
      const settle = (fn: () => void) => {
        clearTimeout(timer);
        this.#pending.delete(fail);
        sub?.unsubscribe();
        fn();
      };
      const fail = (e: Error) => settle(() => reject(e));
      const timer = setTimeout(
        () => fail(new RequestTimeoutError(subject, opts.timeout)),
        opts.timeout,
      );
      this.#pending.add(fail);
      sub = this.subscribe(inbox, { callback: (_err, msg) => settle(() => resolve(msg)) });
      try {
        this.publish(subject, data, inbox);
      } catch (e) {
        fail(e as Error);
      }
    });
  }

  flush(): Promise<void> {
    if (this.#closed) return Promise.reject(new Error("CONNECTION_CLOSED"));
    // What this connection published is routed already; one task later it is delivered.
    return new Promise((resolve) => setTimeout(resolve, 0));
  }

  /** The connection ends: nothing more is delivered to it or sent from it. */
  close(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    this.#closed = true;
    for (const sub of this.#subs) this.#server.removeSub(sub);
    this.#subs.clear();
    this.#queue.length = 0;
    for (const fail of [...this.#pending]) fail(new Error("CONNECTION_CLOSED"));
    return Promise.resolve();
  }

  /** @internal A message for one of this connection's subscriptions. */
  enqueue(sub: FakeSub, m: TappedMessage): void {
    this.#queue.push({ sub, m });
    if (this.#scheduled) return;
    this.#scheduled = true;
    setTimeout(() => this.#deliver(), 0);
  }

  #deliver(): void {
    this.#scheduled = false;
    const batch = this.#queue.splice(0);
    for (const { sub, m } of batch) {
      if (!sub.active || this.#closed) continue;
      const msg: BusMsg = {
        subject: m.subject,
        data: m.data,
        ...(m.reply === undefined ? {} : { reply: m.reply }),
        respond: (data?: Uint8Array) => {
          if (m.reply === undefined || this.#closed) return false;
          this.publish(m.reply, data);
          return true;
        },
      };
      // The client calls callbacks from its reader: what one throws ends that reader.
      sub.callback(null, msg);
    }
  }
}
