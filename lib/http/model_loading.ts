/**
 * What a front of several models answers while a request's model loads: a stream gets its 200
 * at once and SSE comments on the load, a WebSocket is upgraded at once and gets `loading`
 * frames; then the model's app takes over.
 */
import type { Context } from "hono";
import { upgradeWebSocket } from "@hono/node-server";
import type { WSContext } from "hono/ws";
import { ApiError, toApiError } from "./errors.ts";
import { loadError } from "./model_dispatch.ts";
import { type ModelDirectory, ModelLoadError } from "./model_directory.ts";
import type { ErrorFrame, LoadingFrame } from "./protocol.ts";
import type { ServiceMetrics } from "./service_metrics.ts";

/** Client frames a socket may send while its model loads (answered once it is loaded). */
const MAX_HELD_FRAMES = 64;

/** How often the client hears how the load goes. */
const PROGRESS_MS = 500;

export interface LoadingOptions {
  readonly pool: ModelDirectory;
  /** Where a failure past the 200 or the 101 is counted (the front's registry). */
  readonly metrics: ServiceMetrics;
}

function failure(err: unknown): ApiError {
  return err instanceof ModelLoadError ? loadError(err) : toApiError(err);
}

/**
 * A stream for a model that is not loaded yet: answered at once, with an SSE comment line on
 * how the load goes every half second (clients skip comments), then the model's own stream.
 * Past the 200, a failed load or a refused request is a final `data: {"error": ...}` event,
 * as any error once a stream has begun.
 */
export function loadingStream(
  o: LoadingOptions,
  c: Context,
  m: { name: string; keepAliveMs: number | undefined; tenant: string; forward: Request },
): Response {
  const enc = new TextEncoder();
  let timer: ReturnType<typeof setInterval> | undefined;
  let upstream: ReadableStreamDefaultReader<Uint8Array> | undefined;
  let release = () => {};
  let cancelled = false;
  const body = new ReadableStream<Uint8Array>({
    start: async (controller) => {
      const event = (text: string) => controller.enqueue(enc.encode(text));
      const say = () => {
        const p = o.pool.status().find((x) => x.name === m.name)?.progress;
        const bytes = p ? ` ${p.bytes}${p.total === undefined ? "" : `/${p.total}`} bytes` : "";
        event(`: loading model ${JSON.stringify(m.name)}${bytes}\n\n`);
      };
      say();
      timer = setInterval(say, PROGRESS_MS);
      try {
        const lease = await o.pool.acquire(m.name, m.keepAliveMs, m.tenant);
        release = () => lease.release();
        clearInterval(timer);
        const res = await lease.model.service.fetch(m.forward, c.env);
        if (!res.ok || res.body === null) {
          // The model's app refused the request (a 4xx naming the problem): its error
          // envelope is the stream's one event.
          const text = res.body === null ? "" : await res.text();
          let envelope: unknown;
          try {
            envelope = { error: JSON.parse(text).error };
          } catch {
            envelope = toApiError(`the model's app answered ${res.status}: ${text}`).toJSON();
          }
          event(`data: ${JSON.stringify(envelope)}\n\n`);
          return controller.close();
        }
        upstream = res.body.getReader();
        for (;;) {
          const { value, done } = await upstream.read();
          if (done) break;
          controller.enqueue(value);
        }
        controller.close();
      } catch (err) {
        clearInterval(timer);
        if (cancelled) return; // the client left: nothing to tell it
        const e = failure(err);
        o.metrics.errors.inc({ code: e.code });
        event(`data: ${JSON.stringify(e.toJSON())}\n\n`);
        controller.close();
      } finally {
        release();
      }
    },
    cancel: async (reason) => {
      cancelled = true;
      clearInterval(timer);
      await upstream?.cancel(reason);
      release();
    },
  });
  return new Response(body, {
    headers: { "content-type": "text/event-stream", "cache-control": "no-cache" },
  });
}

/**
 * A WebSocket for a model that is not loaded yet: upgraded at once, told how the load goes by
 * `loading` frames (at once, then every half second), then handed to the model's app, which
 * answers the client frames held meanwhile. A failed load is an error frame and a close.
 */
export async function loadingSocket(
  o: LoadingOptions,
  c: Context,
  m: { name: string; tenant: string; id: string },
): Promise<Response> {
  const upgrade = c.req.raw;
  const client = (c.env as { incoming?: { socket?: { remoteAddress?: string } } } | undefined)
    ?.incoming?.socket?.remoteAddress;
  const held: unknown[] = [];
  let session: { onMessage(data: unknown): void; onClose(): void } | undefined;
  let closed = false;
  let timer: ReturnType<typeof setInterval> | undefined;
  const t0 = performance.now();
  const send = (ws: WSContext, frame: LoadingFrame | ErrorFrame) => {
    if (ws.readyState === 1) ws.send(JSON.stringify(frame));
  };
  const adopt = async (ws: WSContext) => {
    const lease = await o.pool.acquire(m.name, undefined, m.tenant);
    try {
      clearInterval(timer);
      if (closed) return;
      const app = lease.model.service;
      if (app.adoptSocket === undefined) throw new Error(`model "${m.name}" cannot take a socket`);
      session = await app.adoptSocket(ws, upgrade, m.id, client);
      if (closed) return session.onClose();
      for (const data of held.splice(0)) session.onMessage(data);
    } finally {
      // As for an upgrade passed on: the socket's generations keep the model busy().
      lease.release();
    }
  };
  const res = await upgradeWebSocket(() => ({
    onOpen: (_evt, ws) => {
      const say = () => {
        const p = o.pool.status().find((x) => x.name === m.name)?.progress;
        send(ws, {
          type: "loading",
          model: m.name,
          bytes: p?.bytes ?? 0,
          ...(p?.total === undefined ? {} : { total_bytes: p.total }),
          elapsed_s: Math.round(performance.now() - t0) / 1000,
        });
      };
      say();
      timer = setInterval(say, PROGRESS_MS);
      adopt(ws).catch((err) => {
        clearInterval(timer);
        if (closed) return;
        const e = failure(err);
        o.metrics.errors.inc({ code: e.code });
        send(ws, { type: "error", code: e.code, message: e.message, param: "model" });
        ws.close(1011, "the model could not be loaded");
      });
    },
    onMessage: (evt, ws) => {
      if (session !== undefined) return session.onMessage(evt.data);
      if (held.length >= MAX_HELD_FRAMES) {
        return send(ws, {
          type: "error",
          code: "loading",
          message: `The model "${m.name}" is loading; at most ${MAX_HELD_FRAMES} frames are ` +
            "held until it is ready, this one was dropped",
        });
      }
      held.push(evt.data);
    },
    onClose: () => {
      closed = true;
      clearInterval(timer);
      session?.onClose();
    },
  }))(c, () => Promise.resolve());
  return res ?? c.res;
}
