/** Headers of a Server-Sent Events response. */
export const SSE_HEADERS: Readonly<Record<string, string>> = {
  "content-type": "text/event-stream; charset=utf-8",
  "cache-control": "no-cache",
  // Reverse proxies (nginx) would otherwise buffer the stream.
  "x-accel-buffering": "no",
};

/** One `data:` event. */
export function sseData(payload: unknown): string {
  return `data: ${typeof payload === "string" ? payload : JSON.stringify(payload)}\n\n`;
}

/**
 * A byte stream of SSE events pulled from `next` one batch at a time, so nothing is produced
 * faster than the client reads (the HTTP server pulls only when the socket can take more).
 * `next` returns the events to send, or null at the end. `onCancel` runs when the client goes
 * away before the end.
 */
export function pullSseStream(
  next: () => Promise<string[] | null>,
  onCancel: () => Promise<void> | void,
): ReadableStream<Uint8Array> {
  const enc = new TextEncoder();
  let finished = false;
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
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
          return;
        }
      }
    },
    async cancel() {
      if (finished) return;
      finished = true;
      await onCancel();
    },
  }, { highWaterMark: 0 });
}
