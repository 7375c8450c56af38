import { connect, credsAuthenticator, type NatsConnection } from "@nats-io/transport-node";

export type { NatsConnection };

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
