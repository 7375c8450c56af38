import { connect, credsAuthenticator, type NatsConnection } from "@nats-io/transport-node";
import { CLUSTER_DEFAULTS } from "./cluster_defaults.ts";

export type { NatsConnection };

/** A message as the cluster code reads it: a NATS `Msg` is one. */
export interface BusMsg {
  readonly subject: string;
  readonly data: Uint8Array;
  /** The inbox of a request; respond() publishes there (false when there is none). */
  readonly reply?: string;
  respond(data?: Uint8Array): boolean;
}

export interface BusSubscription {
  unsubscribe(): void;
}

/**
 * The part of the NATS client that the router, the replica agent and requestInfo() use: core
 * publish/subscribe, request/reply (rejected at once when nobody listens, after `timeout`
 * otherwise), flush, and the closed state. A NatsConnection is one; tests/_fake_nats.ts is an
 * in-process one with the same semantics.
 */
export interface BusConnection {
  /** The server's INFO (max_payload: the largest message it takes). */
  readonly info?: { readonly max_payload: number };
  publish(subject: string, data?: Uint8Array): void;
  subscribe(
    subject: string,
    opts: { callback: (err: Error | null, msg: BusMsg) => void },
  ): BusSubscription;
  request(subject: string, data: Uint8Array, opts: { timeout: number }): Promise<BusMsg>;
  flush(): Promise<void>;
  isClosed(): boolean;
}

export interface NatsOptions {
  /** nats://[user:password@|token@]host:port, comma-separated for several servers. */
  readonly url: string;
  /** A .creds file (JWT + NKey seed), as `nats` tooling writes it. */
  readonly credsFile?: string;
  /** Connection name shown by the server's monitoring. */
  readonly name: string;
  readonly log?: (line: string) => void;
}

/** Server addresses and credentials split out of a NATS URL list. */
export function parseNatsUrl(url: string): {
  servers: string[];
  user?: string;
  pass?: string;
  token?: string;
} {
  const out: { servers: string[]; user?: string; pass?: string; token?: string } = {
    servers: [],
  };
  for (const part of url.split(",").map((s) => s.trim()).filter(Boolean)) {
    let u: URL;
    try {
      u = new URL(part.includes("://") ? part : `nats://${part}`);
    } catch {
      throw new Error(`Invalid NATS URL ${JSON.stringify(part)}: expected nats://host:port`);
    }
    if (!["nats:", "tls:", "ws:", "wss:"].includes(u.protocol)) {
      throw new Error(
        `Invalid NATS URL ${JSON.stringify(part)}: the scheme must be nats:// or tls://, ` +
          `received ${u.protocol}//`,
      );
    }
    if (u.hostname === "") throw new Error(`Invalid NATS URL ${JSON.stringify(part)}: no host`);
    // The client library ignores credentials in a URL, so they are passed as options.
    const user = decodeURIComponent(u.username);
    const pass = decodeURIComponent(u.password);
    if (user !== "" && pass !== "") {
      out.user = user;
      out.pass = pass;
    } else if (user !== "") out.token = user;
    out.servers.push(`${u.protocol}//${u.hostname}:${u.port || "4222"}`);
  }
  if (out.servers.length === 0) throw new Error("Invalid NATS URL: it names no server");
  return out;
}

/**
 * Connects with reconnection forever (a nats-server restart is survived: subscriptions are
 * renewed by the client), logging disconnects and reconnects.
 */
export async function connectNats(opts: NatsOptions): Promise<NatsConnection> {
  const parsed = parseNatsUrl(opts.url);
  const authenticator = opts.credsFile === undefined
    ? undefined
    : credsAuthenticator(await Deno.readFile(opts.credsFile));
  const nc = await connect({
    servers: parsed.servers,
    user: parsed.user,
    pass: parsed.pass,
    token: parsed.token,
    authenticator,
    name: opts.name,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
    reconnectJitter: 100,
    // A CPU engine step can block this thread for seconds: pings must tolerate that (a dead
    // server is seen at once anyway, by the socket closing).
    pingInterval: 10_000,
    maxPingOut: 3,
    waitOnFirstConnect: false,
  }).catch((e: unknown) => {
    throw new Error(
      `Cannot connect to NATS at ${parsed.servers.join(",")}: ${
        e instanceof Error ? e.message : String(e)
      }`,
    );
  });
  const log = opts.log;
  if (log) {
    (async () => {
      for await (const s of nc.status()) {
        if (s.type === "disconnect" || s.type === "reconnect") {
          log(`nats ${s.type} (${parsed.servers.join(",")})`);
        }
      }
    })().catch(() => {});
  }
  return nc;
}

/**
 * A subscription callback that survives its handler. The client calls callbacks from its
 * socket reader: a handler that throws (a publish over max_payload, a subject it refuses) ends
 * that reader, and the connection stays up but deaf, while heartbeats from another thread
 * still call it healthy. The error is reported instead.
 */
export function guarded(
  handler: (msg: BusMsg) => void,
  report: (err: unknown) => void,
): (err: Error | null, msg: BusMsg) => void {
  return (err, msg) => {
    if (err !== null) return;
    try {
      handler(msg);
    } catch (e) {
      try {
        report(e);
      } catch { /* a failing report must not end the reader either */ }
    }
  };
}

/**
 * A log for what peers send: lines cut to `maxChars`, and at most `perWindow` lines per
 * `windowMs`; the rest are counted and the count is logged with the next line let through.
 * A peer can send a malformed message at line rate, and one 1 MB message gave 33 MB of zod
 * issues in one line.
 */
export function cappedLog(
  log: (line: string) => void,
  opts: { maxChars?: number; perWindow?: number; windowMs?: number; now?: () => number } = {},
): (line: string) => void {
  const maxChars = opts.maxChars ?? CLUSTER_DEFAULTS.peerLogMaxChars;
  const perWindow = opts.perWindow ?? CLUSTER_DEFAULTS.peerLogPerWindow;
  const windowMs = opts.windowMs ?? CLUSTER_DEFAULTS.peerLogWindowMs;
  const now = opts.now ?? (() => performance.now());
  let windowStart = -Infinity;
  let inWindow = 0;
  let suppressed = 0;
  return (line) => {
    const t = now();
    if (t - windowStart >= windowMs) {
      windowStart = t;
      inWindow = 0;
    }
    if (inWindow >= perWindow) {
      suppressed++;
      return;
    }
    inWindow++;
    const cut = line.length > maxChars
      ? `${line.slice(0, maxChars)}… (${line.length} chars)`
      : line;
    const note = suppressed > 0 ? ` (${suppressed} similar lines suppressed before this one)` : "";
    suppressed = 0;
    log(cut + note);
  };
}
