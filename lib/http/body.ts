import { ApiError } from "./errors.ts";
import { HTTP_DEFAULTS } from "./defaults.ts";

/**
 * Reads a request body as JSON. Every route reading one sits behind the body limit
 * (body_limit.ts, hono's), which refuses a body over the limit before it is buffered; `maxBytes`
 * holds a caller outside that chain (a batch line run by a front) to the same limit.
 */
export async function readJsonBody(req: Request, maxBytes: number): Promise<unknown> {
  requireJsonType(req.headers.get("content-type"));
  const text = await readBodyText(req, maxBytes);
  if (text.trim().length === 0) {
    throw new ApiError("invalid_json", "Request body is empty; expected a JSON object");
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    const detail = err instanceof Error ? err.message : String(err);
    throw new ApiError("invalid_json", `Request body is not valid JSON: ${detail}`);
  }
}

/** Whether a Content-Type names JSON (parameters such as charset aside). */
export function isJsonMedia(contentType: string | null | undefined): boolean {
  return (contentType ?? "").split(";")[0]!.trim().toLowerCase() === "application/json";
}

/**
 * JSON routes take `application/json` only. A `text/plain` body is what a web page on another
 * site can send without a CORS preflight, so accepting it would let any page drive the server.
 */
export function requireJsonType(contentType: string | null): void {
  if (isJsonMedia(contentType)) return;
  throw new ApiError(
    "unsupported_media_type",
    `Request body must be sent as 'Content-Type: application/json'; received ${
      contentType === null ? "no Content-Type" : JSON.stringify(contentType.slice(0, 80))
    }`,
  );
}

/**
 * A request body as text: the one reader of every front (one model, several, a router), strict
 * about UTF-8 (decodeBody). A connection that ends before the body is complete is the client's
 * fault, and nobody is left to read a 500.
 */
export async function readBodyText(req: Request, maxBytes: number): Promise<string> {
  if (req.body === null) return "";
  let bytes: Uint8Array;
  try {
    bytes = new Uint8Array(await req.arrayBuffer());
  } catch {
    throw bodyEnded(req);
  }
  if (bytes.byteLength > maxBytes) throw tooLarge(bytes.byteLength, maxBytes);
  return decodeBody(bytes);
}

/** The 400 of a body whose connection ended (or timed out) before it was complete. */
export function bodyEnded(req: Request): ApiError {
  const declared = req.headers.get("content-length");
  return new ApiError(
    "invalid_request",
    `Request body ended before it was complete${
      declared === null ? "" : ` (its Content-Length announced ${declared} bytes)`
    }`,
  );
}

/**
 * A JSON body's bytes as text, or a 400 when they are not UTF-8: every front (one model,
 * several, a router) decodes through here. Fatal: a lenient decoder would turn stray bytes into
 * U+FFFD and serve a prompt the client never sent.
 */
export function decodeBody(bytes: Uint8Array): string {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new ApiError(
      "invalid_json",
      `Request body is not valid UTF-8 (${bytes.byteLength} bytes); JSON bodies must be UTF-8 encoded`,
    );
  }
}

/** The 413 of a body over `maxBytes` (`atLeast`: counted while streaming, not declared). */
export function tooLarge(bytes: number, maxBytes: number, atLeast = false): ApiError {
  return new ApiError(
    "payload_too_large",
    `Request body is ${atLeast ? "more than " : ""}${atLeast ? maxBytes : bytes} bytes; ` +
      `the limit is ${maxBytes} bytes`,
  );
}

/**
 * The same request as one of this runtime's own (the server's is an adapter's, which another
 * app or the Request constructor cannot take as it is), with `body` in place of its own where
 * given (the model dispatch read the original's to find the model).
 */
export function rebuilt(req: Request, body?: string): Request {
  const headers = new Headers(req.headers);
  if (body !== undefined) headers.delete("content-length");
  return new Request(req.url, {
    method: req.method,
    headers,
    signal: req.signal,
    ...(body !== undefined
      ? { body }
      : req.body === null
      ? {}
      : { body: req.body, duplex: "half" } as RequestInit),
  });
}

/**
 * Reads and drops what is left of a refused body, within HTTP_DEFAULTS' drain bounds, so the
 * refusal is sent on a connection with nothing unread (see `refusedBodyDrainBytes`). Never throws:
 * a body that ends early or errors has nothing left to drain.
 */
export async function drainRefusedBody(
  body: ReadableStream<Uint8Array> | null,
  maxBytes: number = HTTP_DEFAULTS.refusedBodyDrainBytes,
  ms: number = HTTP_DEFAULTS.refusedBodyDrainMs,
): Promise<void> {
  if (body === null || body.locked) return;
  const reader = body.getReader();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<"late">((r) => timer = setTimeout(() => r("late"), ms));
  try {
    for (let read = 0; read <= maxBytes;) {
      const chunk = await Promise.race([reader.read(), late]);
      if (chunk === "late" || chunk.done) return;
      read += chunk.value.byteLength;
    }
  } catch {
    // The client went away: nothing is left to protect.
  } finally {
    clearTimeout(timer);
    reader.cancel().catch(() => {});
  }
}
