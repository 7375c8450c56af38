/**
 * Resumable, size-checked, atomic HTTP downloads. The bytes stream into `<dest>.part`; only a
 * complete, verified file is renamed to `dest`, so a reader never sees half a model. A `.part`
 * left by a broken connection or a killed process is resumed with a `Range` request next time.
 */
import { sha256OfFile } from "../util/sha256.ts";
import { ProgressBar, type ProgressOptions } from "../util/progress_bar.ts";

/** How {@linkcode downloadFile} fetches, reports and verifies. */
export interface DownloadOptions {
  /** The fetch to use; tests inject one. Default: the global `fetch`. */
  readonly fetch?: typeof fetch;
  /** Progress bar settings, or `false` for none. Default: draw on stderr when it is a terminal. */
  readonly progress?: ProgressOptions | false;
  /** Label on the progress line. Default: the file name of `dest`. */
  readonly label?: string;
  /**
   * Expected SHA-256 of the whole file (hex). Checked after the transfer by reading the `.part`
   * back in chunks, because a resumed prefix was never seen by this process; costs one extra
   * sequential read of the file.
   */
  readonly sha256?: string;
  readonly signal?: AbortSignal;
  /** The `Authorization` header to send (a Hugging Face token, for its hosts only). */
  readonly authorization?: string;
  /** What to do about it when the server refuses access (401, 403), appended to the error. */
  readonly refusedHint?: string;
  /** Called as bytes arrive (received so far, total when the server said). */
  readonly onProgress?: (received: number, total: number | undefined) => void;
}

/** What a finished download produced. */
export interface DownloadResult {
  readonly path: string;
  /** Final size in bytes. */
  readonly bytes: number;
  /** Bytes reused from an earlier `.part` (0 for a fresh download). */
  readonly resumedFrom: number;
}

/** A download that failed in a way the message explains; `cause` holds any underlying error. */
export class DownloadError extends Error {
  override name = "DownloadError";
  /** True when no answer came from the server at all (DNS, connection, TLS). */
  readonly unreachable: boolean;
  constructor(message: string, options?: ErrorOptions & { unreachable?: boolean }) {
    super(message, options);
    this.unreachable = options?.unreachable ?? false;
  }
}

/**
 * What kind of failure a fetch error is, from the text Deno's fetch gives it (its errors are
 * all TypeErrors): a TLS problem, a name that does not resolve, a refused or reset
 * connection, a timeout; or undefined when the text says none of these.
 */
export function connectionProblem(error: unknown): string | undefined {
  const text = errorText(error) + " " + errorText((error as { cause?: unknown })?.cause ?? "");
  if (
    /certificate|tls|ssl|handshake|corrupt message|InvalidContentType|alert|UnknownIssuer|NotValidForName|Expired/i
      .test(text)
  ) {
    return "TLS failed (the server's certificate was not accepted or the handshake failed)";
  }
  if (
    /dns error|failed to lookup|Name or service not known|nodename nor servname|getaddrinfo/i.test(
      text,
    )
  ) {
    return "the host name does not resolve (DNS)";
  }
  if (/refused/i.test(text)) return "the connection was refused";
  if (/reset|broken pipe|closed/i.test(text)) return "the connection was reset";
  if (/timed? ?out/i.test(text)) return "the connection timed out";
  if (/unreachable|no route/i.test(text)) return "the network is unreachable";
  return undefined;
}

/** The suffix of the temporary file a download streams into before its rename. */
export const PART_SUFFIX = ".part";

/**
 * Downloads `url` to `dest`, atomically and resumably.
 *
 * - Streams into `<dest>.part`, holding an exclusive lock on it so that two processes fetching the
 *   same file wait for each other instead of interleaving bytes; the second one finds `dest`
 *   present and returns it.
 * - If a `.part` exists, asks for the rest with `Range: bytes=<partSize>-`. A 206 whose
 *   Content-Range starts there is appended; a 200 (the server ignores ranges) or any other start
 *   begins again from zero; a 416 whose total equals the `.part` size means it was already complete.
 * - Asks for `Accept-Encoding: identity` so Content-Length counts the file's own bytes.
 * - If the connection breaks, the `.part` is kept and the error says so: the next call resumes.
 * - If the transfer ends normally but the size differs from Content-Length (or the Content-Range
 *   total), or the optional SHA-256 differs, the `.part` is deleted and a {@linkcode DownloadError}
 *   thrown: those bytes are wrong, not merely incomplete.
 */
export async function downloadFile(
  url: string,
  dest: string,
  options: DownloadOptions = {},
): Promise<DownloadResult> {
  const part = dest + PART_SUFFIX;
  await Deno.mkdir(parentDir(dest), { recursive: true });
  const file = await Deno.open(part, { read: true, write: true, create: true });
  try {
    await file.lock(true);
    const finished = await statOrNull(dest);
    if (finished?.isFile) {
      // Another process completed it while we waited for the lock; our handle may now be the
      // renamed file itself, so it must not be touched.
      return { path: dest, bytes: finished.size, resumedFrom: finished.size };
    }
    const partSize = (await file.stat()).size;
    let start: TransferStart;
    try {
      start = await startTransfer(url, partSize, options);
    } catch (e) {
      // A refused request (404, an HTML page, no network) must not leave an empty .part behind.
      if (partSize === 0) await Deno.remove(part).catch(() => {});
      throw e;
    }
    if (start.offset === 0) await file.truncate(0);
    await file.seek(start.offset, Deno.SeekMode.Start);

    const bar = options.progress === false ? undefined : new ProgressBar(
      options.label ?? baseName(dest),
      start.total,
      start.offset,
      options.progress,
    );
    const brokeOff = (n: number, cause: unknown) =>
      new DownloadError(
        `${sizeMessage(n, url, start.total)}: the transfer broke off (${errorText(cause)}); ` +
          `${part} is kept and the next run resumes from it`,
        { cause },
      );
    let received = start.offset;
    try {
      if (start.body) {
        const onProgress = (n: number) => {
          received = n;
          bar?.update(n);
          options.onProgress?.(n, start.total ?? undefined);
        };
        await copyBody(start.body, file, received, onProgress, brokeOff);
      }
    } catch (e) {
      if (!(e instanceof WriteFailed)) throw e;
      // A full disk (or a file-size limit): the .part is what fills it, so it goes, and the
      // error says where and how much room the file needs.
      await Deno.remove(part).catch(() => {});
      const need = start.total === undefined ? "" : ` (the file is ${start.total} bytes)`;
      throw new DownloadError(
        `Cannot download ${url} to ${dest}: writing ${part} failed after ${received} bytes ` +
          `(${errorText(e.cause)})${need}; deleted ${part}`,
        { cause: e.cause },
      );
    } finally {
      bar?.finish(received);
    }

    const size = (await file.stat()).size;
    if (start.total !== undefined && size !== start.total) {
      await Deno.remove(part);
      throw new DownloadError(`${sizeMessage(size, url, start.total)}; deleted ${part}`);
    }
    if (options.sha256 !== undefined) {
      const actual = await sha256OfFile(file);
      const expected = options.sha256.toLowerCase();
      if (actual !== expected) {
        await Deno.remove(part);
        throw new DownloadError(
          `Downloaded ${size} bytes of ${url} but their sha256 is ${actual}, expected ${expected}; ` +
            `deleted ${part}`,
        );
      }
    }
    await Deno.rename(part, dest);
    return { path: dest, bytes: size, resumedFrom: start.offset };
  } finally {
    file.close();
  }
}

interface TransferStart {
  /** Where the response body's first byte goes in the file. */
  readonly offset: number;
  /** Size the whole file must have, when the server announced it. */
  readonly total?: number;
  /** Absent when nothing is left to transfer. */
  readonly body?: ReadableStream<Uint8Array>;
}

async function startTransfer(
  url: string,
  partSize: number,
  options: DownloadOptions,
): Promise<TransferStart> {
  const doFetch = options.fetch ?? fetch;
  const headers = new Headers({ "accept-encoding": "identity" });
  if (partSize > 0) headers.set("range", `bytes=${partSize}-`);
  if (options.authorization !== undefined) headers.set("authorization", options.authorization);
  let response: Response;
  try {
    response = await doFetch(url, { headers, signal: options.signal });
  } catch (cause) {
    if (options.signal?.aborted) throw cause;
    const problem = connectionProblem(cause);
    throw new DownloadError(
      `Cannot download ${url}: ${problem ?? "the request failed"} (${errorText(cause)})`,
      { cause, unreachable: true },
    );
  }
  const range = parseContentRange(response.headers.get("content-range"));

  if (response.status === 416 && partSize > 0) {
    await response.body?.cancel();
    // Nothing past our .part: it is complete if the server's size agrees, otherwise stale.
    if (range?.total === partSize) return { offset: partSize, total: partSize };
    return startTransfer(url, 0, options);
  }
  if (!response.ok) {
    await response.body?.cancel();
    const refused = response.status === 401 || response.status === 403;
    const hint = refused && options.refusedHint !== undefined ? `; ${options.refusedHint}` : "";
    throw new DownloadError(
      `Cannot download ${url}: the server answered HTTP ${response.status} ${response.statusText}${hint}`,
    );
  }
  const type = response.headers.get("content-type") ?? "";
  if (type.toLowerCase().startsWith("text/html")) {
    await response.body?.cancel();
    throw new DownloadError(
      `Cannot download ${url}: the server answered with a web page (Content-Type ${type}), not a ` +
        "file; use a direct download link (on Hugging Face .../resolve/main/<file>, not .../blob/main/<file>)",
    );
  }
  const length = announcedLength(response);
  if (response.status === 206) {
    if (range === undefined || range.start !== partSize) {
      const rangeHeader = JSON.stringify(response.headers.get("content-range"));
      await response.body?.cancel();
      if (partSize === 0) {
        throw new DownloadError(
          `Cannot download ${url}: the server sent a partial response (Content-Range ` +
            `${rangeHeader}) to a request for the whole file`,
        );
      }
      return startTransfer(url, 0, options);
    }
    const total = range.total ?? (length === undefined ? undefined : partSize + length);
    return { offset: partSize, total, body: response.body ?? undefined };
  }
  return { offset: 0, total: length, body: response.body ?? undefined };
}

async function copyBody(
  body: ReadableStream<Uint8Array>,
  file: Deno.FsFile,
  startAt: number,
  onProgress: (received: number) => void,
  brokeOff: (received: number, cause: unknown) => Error,
): Promise<number> {
  const reader = body.getReader();
  let received = startAt;
  let finished = false;
  try {
    while (true) {
      let step: ReadableStreamReadResult<Uint8Array>;
      try {
        step = await reader.read();
      } catch (cause) {
        finished = true; // an errored stream needs no cancel
        throw brokeOff(received, cause);
      }
      if (step.done) {
        finished = true;
        return received;
      }
      try {
        await writeAll(file, step.value);
      } catch (cause) {
        throw new WriteFailed(cause);
      }
      received += step.value.length;
      onProgress(received);
    }
  } finally {
    // A failed disk write leaves the body half read; release the connection.
    if (!finished) await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}

/** The disk refused a write (ENOSPC, EFBIG, EIO): not a transfer that may resume. */
class WriteFailed extends Error {
  constructor(override readonly cause: unknown) {
    super(errorText(cause));
  }
}

async function writeAll(file: Deno.FsFile, bytes: Uint8Array): Promise<void> {
  let offset = 0;
  while (offset < bytes.length) offset += await file.write(bytes.subarray(offset));
}

/** Content-Length, unless a content coding makes it count other bytes than the file's. */
function announcedLength(response: Response): number | undefined {
  const coding = response.headers.get("content-encoding");
  if (coding !== null && coding.toLowerCase() !== "identity") return undefined;
  return parseNonNegativeInt(response.headers.get("content-length"));
}

/** Parses a Content-Range value: `bytes <start>-<end>/<total>`, where total may be `*`, or `bytes *` + `/<total>`. */
export function parseContentRange(
  header: string | null,
): { start?: number; end?: number; total?: number } | undefined {
  if (header === null) return undefined;
  const match = /^\s*bytes\s+(?:(\d+)-(\d+)|\*)\s*\/\s*(\d+|\*)\s*$/i.exec(header);
  if (match === null) return undefined;
  const [, start, end, total] = match;
  return {
    start: parseNonNegativeInt(start ?? null),
    end: parseNonNegativeInt(end ?? null),
    total: parseNonNegativeInt(total ?? null),
  };
}

function parseNonNegativeInt(text: string | null): number | undefined {
  if (text === null || !/^\d+$/.test(text.trim())) return undefined;
  const value = Number(text.trim());
  return Number.isSafeInteger(value) ? value : undefined;
}

function sizeMessage(received: number, url: string, total: number | undefined): string {
  return total === undefined
    ? `Downloaded ${received} bytes of ${url} (the server announced no size)`
    : `Downloaded ${received} bytes of ${url} but the server announced ${total}`;
}

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

async function statOrNull(path: string): Promise<Deno.FileInfo | null> {
  try {
    return await Deno.stat(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return null;
    throw error;
  }
}

function parentDir(path: string): string {
  const cut = Math.max(path.lastIndexOf("/"), path.lastIndexOf("\\"));
  if (cut < 0) return ".";
  return cut === 0 ? path.slice(0, 1) : path.slice(0, cut);
}

function baseName(path: string): string {
  return path.slice(Math.max(path.lastIndexOf("/"), path.lastIndexOf("\\")) + 1);
}
