import type { Hono } from "hono";
import { upgradeWebSocket } from "@hono/node-server";
import type { WSContext } from "hono/ws";
import { ApiError } from "./errors.ts";
import type { FrameSocket } from "./frame_writer.ts";
import type { GenerationDeps } from "./tracked_generation.ts";
import { CLOSE_GOING_AWAY, type SessionOptions, StreamSession } from "./ws_session.ts";
import { DRAINING_MESSAGE } from "../core/draining.ts";

export interface StreamRouteOptions {
  readonly deps: GenerationDeps;
  readonly session: SessionOptions;
  /** WebSockets one client address may hold open; past it an upgrade is refused with 429. */
  readonly maxPerClient: number;
  readonly isDraining: () => boolean;
  /** The upgrade's request id (the socket's generations log as "<id>.<n>/<client id>"). */
  readonly requestIdOf: (req: Request) => string | undefined;
  /** The upgrade's cache scope, which every generation on the socket runs under. */
  readonly scopeOf: (req: Request) => string | undefined;
  /** Counts an adopted socket refused for the per-client limit (the error metric). */
  readonly onRefused?: (e: ApiError) => void;
}

/** The open sockets of `GET /v1/stream`. */
export interface StreamSockets {
  readonly size: number;
  /**
   * Serves a socket upgraded elsewhere (the front of a server of several models upgrades at
   * once and hands it over once the model is loaded); `client`'s sockets count against
   * maxPerClient here too. A client past the limit gets an error frame and close 1008.
   */
  adopt(
    ws: WSContext,
    sessionId: string,
    scope: string | undefined,
    client?: string,
  ): { onMessage(data: unknown): void; onClose(): void };
  /** Closes every socket with 1001 (a drain's end, or close()). */
  closeAll(): void;
}

/**
 * `GET /v1/stream`: checks the upgrade (refusals go out as the status and headers alone, ws
 * writes them on the raw socket, so each has its own status), then runs one StreamSession
 * per socket. A plain GET is 426.
 */
export function registerStreamRoute(app: Hono, o: StreamRouteOptions): StreamSockets {
  const sessions = new Set<StreamSession>();
  /** Open WebSockets by client address. */
  const socketsByClient = new Map<string, number>();
  let sessionCounter = 0;
  /** The refusal for a client already at the limit, or undefined. */
  const overLimit = (client: string | undefined): ApiError | undefined =>
    client !== undefined && (socketsByClient.get(client) ?? 0) >= o.maxPerClient
      ? new ApiError(
        "too_many_connections",
        `This client already holds ${o.maxPerClient} WebSockets, the most one address may ` +
          "open; close one (several generations can share a socket)",
      )
      : undefined;
  /** Counts a socket against its client; the returned release uncounts it, once. */
  const count = (client: string | undefined): () => void => {
    if (client === undefined) return () => {};
    socketsByClient.set(client, (socketsByClient.get(client) ?? 0) + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const n = (socketsByClient.get(client) ?? 1) - 1;
      if (n <= 0) socketsByClient.delete(client);
      else socketsByClient.set(client, n);
    };
  };

  app.get("/v1/stream", async (c, next) => {
    if (c.req.header("upgrade")?.toLowerCase() !== "websocket") return await next();
    if (o.isDraining()) {
      throw new ApiError("draining", DRAINING_MESSAGE);
    }
    // Without it node:http hands the request over as a plain one, on which the upgrade failed
    // with 500.
    const connection = c.req.header("connection") ?? "";
    if (!connection.split(",").some((t) => t.trim().toLowerCase() === "upgrade")) {
      throw new ApiError(
        "invalid_request",
        `A WebSocket upgrade needs the header 'Connection: Upgrade'; received ${
          JSON.stringify(connection.slice(0, 60) || "none")
        }`,
      );
    }
    const key = c.req.header("sec-websocket-key");
    if (key === undefined || !/^[A-Za-z0-9+/]{22}==$/.test(key)) {
      throw new ApiError(
        "invalid_request",
        `A WebSocket upgrade needs a Sec-WebSocket-Key of 16 base64 bytes; received ${
          key === undefined ? "none" : JSON.stringify(key.slice(0, 40))
        }`,
      );
    }
    if (c.req.header("sec-websocket-version") !== "13") {
      throw new ApiError(
        "upgrade_required",
        `Only WebSocket version 13 is supported; received ${
          JSON.stringify(c.req.header("sec-websocket-version") ?? "none")
        }`,
      );
    }
    const refusal = overLimit(remoteAddress(c.env));
    if (refusal) throw refusal;
    await next();
  });
  app.get(
    "/v1/stream",
    upgradeWebSocket((c) => {
      let session: StreamSession | undefined;
      const client = remoteAddress(c.env);
      let release = () => {};
      const sessionId = o.requestIdOf(c.req.raw) ?? `ws${++sessionCounter}`;
      const open = (ws: WSContext) => {
        if (session === undefined) {
          session = new StreamSession(
            o.deps,
            o.session,
            frameSocket(ws),
            sessionId,
            o.scopeOf(c.req.raw),
          );
          sessions.add(session);
          release = count(client);
        }
        return session;
      };
      return {
        onOpen: (_evt, ws) => void open(ws),
        onMessage: (evt, ws) => open(ws).onMessage(evt.data),
        onClose: () => {
          release();
          if (session === undefined) return;
          session.onClose();
          sessions.delete(session);
        },
      };
    }),
    () => {
      throw new ApiError(
        "upgrade_required",
        "GET /v1/stream is a WebSocket endpoint; connect with a WebSocket client " +
          "(header 'Upgrade: websocket')",
      );
    },
  );

  return {
    get size() {
      return sessions.size;
    },
    adopt(ws, sessionId, scope, client) {
      const e = overLimit(client);
      if (e) {
        o.onRefused?.(e);
        ws.send(JSON.stringify({ type: "error", code: e.code, message: e.message }));
        ws.close(1008, "too many WebSockets from this client");
        return { onMessage() {}, onClose() {} };
      }
      const release = count(client);
      const session = new StreamSession(o.deps, o.session, frameSocket(ws), sessionId, scope);
      sessions.add(session);
      return {
        onMessage: (data) => session.onMessage(data),
        onClose: () => {
          release();
          session.onClose();
          sessions.delete(session);
        },
      };
    },
    closeAll() {
      for (const s of sessions) s.close(CLOSE_GOING_AWAY, "server is shutting down");
      sessions.clear();
    },
  };
}

function frameSocket(ws: WSContext): FrameSocket {
  const raw = ws.raw as { bufferedAmount?: number } | undefined;
  return {
    send: (text) => ws.send(text),
    // Deno's WebSocket counts bytes handed to send() and not yet written to the network.
    get bufferedAmount() {
      return raw?.bufferedAmount ?? 0;
    },
    get isOpen() {
      return ws.readyState === 1;
    },
    close: (code, reason) => ws.close(code, reason),
  };
}

/** The client's address from @hono/node-server's env (absent under app.request in tests). */
function remoteAddress(env: unknown): string | undefined {
  const incoming = (env as { incoming?: { socket?: { remoteAddress?: string } } } | undefined)
    ?.incoming;
  return incoming?.socket?.remoteAddress;
}
