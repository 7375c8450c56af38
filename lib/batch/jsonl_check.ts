import { ApiError } from "../http/errors.ts";

export interface JsonlLimits {
  /** Most request (non-blank) lines. */
  readonly maxLines: number;
  /** Longest line in bytes: a longer one could never run (see batchLineBytes). */
  readonly maxLineBytes: number;
}

/** A request line may hold a body up to the HTTP body limit, plus its envelope. */
const LINE_ENVELOPE_BYTES = 8 * 1024;

/** The longest input line the queue takes, given the server's JSON body limit. */
export function batchLineBytes(maxBodyBytes: number): number {
  return maxBodyBytes + LINE_ENVELOPE_BYTES;
}

/**
 * Checks a JSONL file as its bytes stream past, holding at most one line: every line valid
 * UTF-8, every non-blank line one JSON value, no more than `maxLines` of them. The lines are
 * the ones splitLines() sees in the whole text (split on "\n", a trailing "\r" dropped,
 * whitespace-only lines skipped). Splitting on the byte 0x0A is safe: UTF-8 never uses it
 * inside a character, so each line decodes on its own.
 */
export class JsonlChecker {
  readonly #limits: JsonlLimits;
  readonly #decoder = new TextDecoder("utf-8", { fatal: true });
  #parts: Uint8Array[] = [];
  #partBytes = 0;
  #lineNumber = 0;
  #lines = 0;

  constructor(limits: JsonlLimits) {
    this.#limits = limits;
  }

  /** Request lines seen so far. */
  get lines(): number {
    return this.#lines;
  }

  /** Takes the next bytes of the file; throws a 4xx ApiError at the first problem. */
  push(chunk: Uint8Array): void {
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(0x0a, start);
      if (nl < 0) {
        this.#hold(chunk.subarray(start));
        return;
      }
      // A line whole in this chunk is checked where it lies: copying every byte doubled the
      // garbage an upload makes, and so its peak RSS until V8 collects it.
      if (this.#parts.length === 0) this.#endLine(this.#within(chunk.subarray(start, nl)));
      else {
        this.#hold(chunk.subarray(start, nl));
        this.#endLine();
      }
      start = nl + 1;
    }
  }

  /** The file ended: checks its last line (a trailing newline is optional). */
  end(): number {
    if (this.#partBytes > 0 || this.#parts.length > 0) this.#endLine();
    return this.#lines;
  }

  #hold(bytes: Uint8Array): void {
    if (bytes.length === 0) return;
    this.#within(bytes, this.#partBytes + bytes.length);
    this.#partBytes += bytes.length;
    // Copied: the stream may reuse the chunk's memory once it is handed on.
    this.#parts.push(bytes.slice());
  }

  /** Throws if the current line, `length` bytes so far, is over the limit; returns `bytes`. */
  #within(bytes: Uint8Array, length = bytes.length): Uint8Array {
    if (length > this.#limits.maxLineBytes) {
      throw new ApiError(
        "invalid_request",
        `Line ${this.#lineNumber + 1} of the file is longer than ${this.#limits.maxLineBytes} ` +
          `bytes, the longest request line this server runs (its body limit plus the line's fields)`,
        "file",
      );
    }
    return bytes;
  }

  /** Checks the line held in #parts, or `whole` when the line lay in one chunk. */
  #endLine(whole?: Uint8Array): void {
    this.#lineNumber++;
    const bytes = whole ??
      (this.#parts.length === 1 ? this.#parts[0]! : concat(this.#parts, this.#partBytes));
    this.#parts = [];
    this.#partBytes = 0;
    let text: string;
    try {
      text = this.#decoder.decode(bytes);
    } catch {
      throw new ApiError(
        "invalid_request",
        `The file is not valid UTF-8 text (JSONL): line ${this.#lineNumber} has bytes that are not UTF-8`,
        "file",
      );
    }
    if (text.endsWith("\r")) text = text.slice(0, -1);
    if (text.trim() === "") return;
    this.#lines++;
    if (this.#lines > this.#limits.maxLines) {
      throw new ApiError(
        "invalid_request",
        `The file has at least ${this.#lines} request lines; the limit is ${this.#limits.maxLines} (--batch-max-lines)`,
        "file",
      );
    }
    try {
      JSON.parse(text);
    } catch (e) {
      throw new ApiError(
        "invalid_request",
        `Line ${this.#lineNumber} is not valid JSON: ${(e as Error).message}`,
        "file",
      );
    }
  }
}

function concat(parts: readonly Uint8Array[], total: number): Uint8Array {
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
