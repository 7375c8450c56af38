import { ApiError } from "./errors.ts";

/**
 * Reads a request body as JSON, refusing it with 413 as soon as it passes `maxBytes` (the
 * declared Content-Length is checked first, then the bytes actually streamed, so a lying or
 * chunked client cannot make the server buffer more than the limit).
 */
export async function readJsonBody(req: Request, maxBytes: number): Promise<unknown> {
  requireJsonType(req.headers.get("content-type"));
  const declared = Number(req.headers.get("content-length") ?? "NaN");
  if (Number.isFinite(declared) && declared > maxBytes) {
    throw tooLarge(declared, maxBytes);
  }
  const text = await readLimited(req, maxBytes);
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

/**
 * JSON routes take `application/json` only. A `text/plain` body is what a web page on another
 * site can send without a CORS preflight, so accepting it would let any page drive the server.
 */
export function requireJsonType(contentType: string | null): void {
  const media = (contentType ?? "").split(";")[0]!.trim().toLowerCase();
  if (media === "application/json") return;
  throw new ApiError(
    "unsupported_media_type",
    `Request body must be sent as 'Content-Type: application/json'; received ${
      contentType === null ? "no Content-Type" : JSON.stringify(contentType.slice(0, 80))
    }`,
  );
}

async function readLimited(req: Request, maxBytes: number): Promise<string> {
  if (req.body === null) return "";
  const reader = req.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    let chunk: ReadableStreamReadResult<Uint8Array>;
    try {
      chunk = await reader.read();
    } catch {
      // The connection ended (or timed out, or the server is shutting down) before the body
      // was complete: the client's fault, and nobody is left to read a 500.
      throw new ApiError(
        "invalid_request",
        `Request body ended after ${total} bytes${
          req.headers.get("content-length") === null
            ? ""
            : ` of the ${req.headers.get("content-length")} its Content-Length announced`
        }`,
      );
    }
    const { done, value } = chunk;
    if (done) break;
    total += value.byteLength;
    if (total > maxBytes) {
      await reader.cancel();
      throw tooLarge(total, maxBytes, true);
    }
    chunks.push(value);
  }
  const all = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.byteLength;
  }
  return decodeBody(all);
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
