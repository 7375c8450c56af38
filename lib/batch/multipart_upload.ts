import { Busboy, type BusboyFileStream } from "@fastify/busboy";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { ApiError, preview } from "../http/errors.ts";
import { isDiskFull } from "./disk_full.ts";
import { JsonlChecker, type JsonlLimits } from "./jsonl_check.ts";

export interface UploadLimits extends JsonlLimits {
  /** Largest file part, in bytes. */
  readonly maxFileBytes: number;
}

/** What arrived: the form's text fields and the file part, already on disk at `path`. */
export interface ReceivedUpload {
  readonly fields: ReadonlyMap<string, string>;
  readonly filename: string;
  readonly bytes: number;
  readonly lines: number;
}

/** Room for a multipart body's boundaries and its `purpose` part, besides the file. */
const MULTIPART_OVERHEAD = 64 * 1024;

/**
 * Streams a multipart/form-data upload's `file` part into `path` as it arrives, checking it
 * on the way (size, line count, UTF-8, each line's JSON: JsonlChecker), so memory holds a
 * chunk and a line, never the file. `onBytes` sees each chunk's size first (a quota can refuse
 * it). Any refusal or failure removes `path` and throws; the request body is not read further.
 *
 * The parser is @fastify/busboy (node streams, which Deno runs): Request.formData() and the
 * web-stream parsers we looked at buffer a whole part in memory.
 */
export async function receiveUpload(
  req: Request,
  path: string,
  limits: UploadLimits,
  onBytes: (n: number) => void,
): Promise<ReceivedUpload> {
  const type = requireMultipart(req);
  const maxBody = limits.maxFileBytes + MULTIPART_OVERHEAD;
  const declared = Number(req.headers.get("content-length") ?? "NaN");
  if (Number.isFinite(declared) && declared > maxBody) {
    throw tooLarge(`The upload is ${declared} bytes`, maxBody, "with the multipart framing ");
  }
  const out = await Deno.open(path, { write: true, create: true, truncate: true });
  let closed = false;
  const close = () => {
    if (!closed) out.close();
    closed = true;
  };
  try {
    const got = await parse(req, type, limits, out, onBytes);
    await out.sync();
    close();
    return got;
  } catch (e) {
    close();
    await Deno.remove(path).catch(() => {});
    throw e;
  }
}

function requireMultipart(req: Request): string {
  const type = req.headers.get("content-type") ?? "";
  if (!/^multipart\/form-data\s*;/i.test(type)) {
    throw new ApiError(
      "unsupported_media_type",
      `Upload a file as 'Content-Type: multipart/form-data' with parts 'file' and 'purpose'; received ${
        type === "" ? "no Content-Type" : preview(type)
      }`,
    );
  }
  return type;
}

async function parse(
  req: Request,
  type: string,
  limits: UploadLimits,
  out: Deno.FsFile,
  onBytes: (n: number) => void,
): Promise<ReceivedUpload> {
  const fields = new Map<string, string>();
  const checker = new JsonlChecker(limits);
  let file: Promise<{ filename: string; bytes: number }> | undefined;
  let fileStream: BusboyFileStream | undefined;
  let bb: ReturnType<typeof Busboy>;
  try {
    bb = Busboy({
      headers: { "content-type": type },
      limits: { files: 1, fields: 8, fieldSize: 1024, headerPairs: 16 },
    });
  } catch (e) {
    throw notMultipart(e);
  }
  bb.on("field", (name: string, value: string) => fields.set(name, value));
  bb.on("file", (name: string, stream: BusboyFileStream, filename: string) => {
    if (name !== "file" || file !== undefined) {
      stream.resume();
      return;
    }
    fileStream = stream;
    file = sink(stream, filename, limits, checker, out, onBytes);
    // A refusal stops the whole upload at once, not when the client finishes sending.
    file.catch((e) => bb.destroy(e));
  });
  const body = req.body === null ? Readable.from([]) : Readable.fromWeb(req.body as never);
  // A client that leaves mid-upload ends its body stream with neither data nor an error: the
  // request's signal is what tells.
  const left = () =>
    bb.destroy(new ApiError("invalid_request", "The client closed the connection mid-upload"));
  req.signal.addEventListener("abort", left, { once: true });
  try {
    await pipeline(body, bb, { signal: req.signal });
  } catch (e) {
    // Busboy does not end a file stream it was reading when it is destroyed: end it here, so
    // that the sink stops (a sink that failed first has its own error, reported instead).
    fileStream?.destroy(e as Error);
    const failed = file === undefined ? undefined : await file.then(() => undefined, (f) => f);
    const err = failed ?? e;
    if (err instanceof ApiError || isDiskFull(err)) throw err;
    throw notMultipart(err);
  } finally {
    req.signal.removeEventListener("abort", left);
  }
  if (file === undefined) {
    throw new ApiError(
      "invalid_request",
      "Missing 'file': send the JSONL input as a multipart file part named 'file'",
      "file",
    );
  }
  const { filename, bytes } = await file;
  return { fields, filename, bytes, lines: checker.end() };
}

async function sink(
  stream: BusboyFileStream,
  filename: string,
  limits: UploadLimits,
  checker: JsonlChecker,
  out: Deno.FsFile,
  onBytes: (n: number) => void,
): Promise<{ filename: string; bytes: number }> {
  let bytes = 0;
  for await (const chunk of stream as AsyncIterable<Uint8Array>) {
    bytes += chunk.length;
    if (bytes > limits.maxFileBytes) {
      throw tooLarge(`The file is more than ${limits.maxFileBytes} bytes`, limits.maxFileBytes);
    }
    onBytes(chunk.length);
    checker.push(chunk);
    let at = 0;
    while (at < chunk.length) at += await out.write(chunk.subarray(at));
  }
  return { filename, bytes };
}

function tooLarge(what: string, limit: number, framing = ""): ApiError {
  return new ApiError(
    "payload_too_large",
    `${what}; the limit is ${limit} bytes ${framing}(--batch-max-file-size)`,
    "file",
  );
}

function notMultipart(e: unknown): ApiError {
  return new ApiError(
    "invalid_request",
    `The upload is not valid multipart/form-data: ${(e as Error).message ?? e}`,
  );
}
