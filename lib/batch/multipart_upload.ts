import { Busboy, type BusboyFileStream } from "@fastify/busboy";
import { ApiError, preview } from "../http/errors.ts";
import { drainRefusedBody } from "../http/body.ts";
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
 * it). Any refusal or failure removes `path` and throws (see DISCARD_BYTES for the rest of the
 * body).
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
    await drainRefusedBody(req.body);
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
  let failure: unknown;
  const failed = new AbortController();
  const fail = (e: unknown) => {
    if (failure !== undefined) return;
    failure = e;
    failed.abort();
    // Busboy leaves a file stream it was feeding open when it is destroyed: end it too.
    fileStream?.destroy();
    bb.destroy();
  };
  bb.on("error", fail);
  bb.on("field", (name: string, value: string) => fields.set(name, value));
  bb.on("file", (name: string, stream: BusboyFileStream, filename: string) => {
    if (name !== "file" || file !== undefined) {
      stream.resume();
      return;
    }
    fileStream = stream;
    file = sink(stream, filename, limits, checker, out, onBytes);
    file.catch(fail);
  });
  await pump(req, bb, limits.maxFileBytes + MULTIPART_OVERHEAD, failed.signal, fail)
    .catch(fail);
  // Busboy ends with "finish"; an error or a failing sink destroys it, which emits nothing.
  if (failure === undefined) await event(bb, "finish", failed.signal);
  const got = failure === undefined ? await file?.catch(fail) : await file?.catch(() => {});
  if (failure !== undefined) {
    if (failure instanceof ApiError || isDiskFull(failure)) throw failure;
    throw notMultipart(failure);
  }
  if (got === undefined) {
    throw new ApiError(
      "invalid_request",
      "Missing 'file': send the JSONL input as a multipart file part named 'file'",
      "file",
    );
  }
  return { fields, filename: got.filename, bytes: got.bytes, lines: checker.end() };
}

/**
 * After a refusal, the body is read on and dropped for this many bytes more before the
 * connection is cut: a client still sending when the server closes may see a reset instead of
 * the answer. Bounded, because dropped chunks are garbage that V8 collects late (it runs a
 * collection for outside-heap buffers only every ~64 MiB): reading a whole 60 MiB body to the
 * end raised the peak RSS by 63 MiB.
 */
const DISCARD_BYTES = 8 * 1024 * 1024;

/** Feeds the request body to the parser, waiting while it is busy (see DISCARD_BYTES). */
async function pump(
  req: Request,
  bb: ReturnType<typeof Busboy>,
  maxBody: number,
  failed: AbortSignal,
  fail: (e: unknown) => void,
): Promise<void> {
  if (req.body === null) return void bb.end();
  const reader = req.body.getReader();
  // A client that leaves mid-upload ends its body stream with neither data nor an error: the
  // request's signal is what tells.
  const leave = () => void reader.cancel().catch(() => {});
  req.signal.addEventListener("abort", leave, { once: true });
  let total = 0;
  let refusedAt = 0;
  try {
    for (;;) {
      const r = await reader.read();
      if (r.done || req.signal.aborted) break;
      total += r.value.length;
      if (total > maxBody && !failed.aborted) {
        fail(
          tooLarge(
            `The upload is more than ${maxBody} bytes`,
            maxBody,
            "with the multipart framing ",
          ),
        );
      }
      if (failed.aborted) {
        refusedAt ||= total;
        if (total > maxBody || total - refusedAt > DISCARD_BYTES) {
          return void reader.cancel().catch(() => {});
        }
        continue;
      }
      // A destroyed busboy emits neither "drain" nor "close": the failure ends the wait.
      if (!bb.write(r.value)) await event(bb, "drain", failed);
    }
  } finally {
    req.signal.removeEventListener("abort", leave);
  }
  if (req.signal.aborted) {
    throw new ApiError("invalid_request", "The client closed the connection mid-upload");
  }
  if (!failed.aborted) bb.end();
}

/** Resolves at busboy's `name` event, or once the upload has failed. */
function event(bb: ReturnType<typeof Busboy>, name: string, failed: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      bb.off(name, done);
      failed.removeEventListener("abort", done);
      resolve();
    };
    bb.on(name, done);
    failed.addEventListener("abort", done);
    if (failed.aborted || (name === "finish" && bb.writableFinished)) done();
  });
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
