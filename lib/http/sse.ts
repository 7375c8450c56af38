/** Headers of a Server-Sent Events response. */
export const SSE_HEADERS: Readonly<Record<string, string>> = {
  "content-type": "text/event-stream; charset=utf-8",
  "cache-control": "no-cache",
  // Reverse proxies (nginx) would otherwise buffer the stream.
  "x-accel-buffering": "no",
};

/** One named event (`event:` then `data:`), as Anthropic's streams are. */
export function sseEvent(name: string, payload: unknown): string {
  return `event: ${name}\ndata: ${JSON.stringify(payload)}\n\n`;
}

/** One `data:` event. */
export function sseData(payload: unknown): string {
  return `data: ${typeof payload === "string" ? payload : JSON.stringify(payload)}\n\n`;
}

/**
 * A byte stream of SSE events pulled from `next` one batch at a time, so nothing is produced
 * faster than the client reads (the HTTP server pulls only when the socket can take more).
 * `next` returns the events to send, or null at the end. `onCancel` runs when the client goes
 * away before the end, and when it stalls: a client that takes nothing for `stallTimeoutMs`
 * after an event was sent has its stream cut (`onStall` first), as a WebSocket is closed with
 * 1008. Without that, clients that never read held their sequences, and 90 of them filled
 * every running and waiting slot.
 */
export function pullSseStream(
  next: () => Promise<string[] | null>,
  onCancel: () => Promise<void> | void,
  opts: { stallTimeoutMs?: number; onStall?: () => void } = {},
): ReadableStream<Uint8Array> {
  const enc = new TextEncoder();
  let finished = false;
  let stall: ReturnType<typeof setTimeout> | undefined;
  let ctrl: ReadableStreamDefaultController<Uint8Array>;
  const ms = opts.stallTimeoutMs;
  const arm = () => {
    if (ms === undefined || !(ms > 0)) return;
    stall = setTimeout(async () => {
      if (finished) return;
      finished = true;
      opts.onStall?.();
      try {
        await onCancel();
      } finally {
        // The server answers a stream error by destroying the socket (what frees it, since
        // the client reads nothing) and logs the error: one line, not a stack.
        const err = new Error(`SSE stream cut: its client read nothing for ${ms} ms`);
        err.stack = err.message;
        ctrl.error(err);
      }
    }, ms);
  };
  return new ReadableStream<Uint8Array>({
    start(controller) {
      ctrl = controller;
    },
    async pull(controller) {
      clearTimeout(stall);
      // Loop until something is enqueued: an empty pull would leave the reader waiting.
      for (;;) {
        const events = await next();
        if (finished) return;
        if (events === null) {
          finished = true;
          controller.close();
          return;
        }
        if (events.length > 0) {
          controller.enqueue(enc.encode(events.join("")));
          arm();
          return;
        }
      }
    },
    async cancel() {
      clearTimeout(stall);
      if (finished) return;
      finished = true;
      await onCancel();
    },
  }, { highWaterMark: 0 });
}
