import { formatBytes } from "./byte_size.ts";

/**
 * Download and load progress on stderr. On a terminal it is one line redrawn in place with a
 * carriage return; where stderr is a pipe or a file (a supervisor's log, CI) it writes whole
 * lines instead, one every few seconds, so a long download shows it is moving without filling
 * the log with redraws.
 */

/** Where and how often a progress bar draws. */
export interface ProgressOptions {
  /** Receives every rendered chunk instead of stderr; giving one forces drawing. */
  readonly sink?: (text: string) => void;
  /** Draw on stderr even when it is not a terminal. */
  readonly force?: boolean;
  /**
   * Minimum time between redraws. Default 100 ms on a terminal; in line mode 5 s, and the first
   * line waits that long too (quick work writes nothing), and the final one is written only
   * after an earlier line.
   */
  readonly intervalMs?: number;
  /**
   * `redraw` in place (the default on a terminal and with a sink) or whole `lines` (the
   * default when stderr is not a terminal).
   */
  readonly mode?: "redraw" | "lines";
  /** Clock in milliseconds, injectable for tests. Default `performance.now`. */
  readonly now?: () => number;
}

/** What one progress line shows. */
export interface ProgressState {
  readonly label: string;
  /** Bytes present so far, including any resumed prefix. */
  readonly received: number;
  /** Announced total size, when the server said it. */
  readonly total?: number;
  /** Bytes transferred in this run (a resumed prefix does not count towards the rate). */
  readonly transferred: number;
  readonly elapsedMs: number;
}

const BAR_WIDTH = 24;
/**
 * Renders one progress line without control characters, e.g.
 * `tok512.bin [############------------]  50%  3.0 KiB / 6.1 KiB  1.2 MiB/s`.
 * Without a known total it shows only the byte count and the rate.
 */
export function formatProgress(state: ProgressState): string {
  const seconds = state.elapsedMs / 1000;
  const rate = seconds > 0 ? `${formatBytes(Math.round(state.transferred / seconds))}/s` : "-";
  if (state.total === undefined || state.total <= 0) {
    return `${state.label} ${formatBytes(state.received)}  ${rate}`;
  }
  const fraction = Math.min(1, state.received / state.total);
  const filled = Math.floor(fraction * BAR_WIDTH);
  const bar = "#".repeat(filled) + "-".repeat(BAR_WIDTH - filled);
  const percent = `${Math.floor(fraction * 100)}%`.padStart(4);
  return `${state.label} [${bar}] ${percent}  ${formatBytes(state.received)} / ${
    formatBytes(state.total)
  }  ${rate}`;
}

/** A throttled, redraw-in-place progress line. Inert when nothing should be drawn. */
export class ProgressBar {
  readonly #label: string;
  readonly #total: number | undefined;
  readonly #startBytes: number;
  readonly #write: ((text: string) => void) | undefined;
  readonly #intervalMs: number;
  readonly #now: () => number;
  readonly #startedAt: number;
  readonly #lines: boolean;
  #lastDrawAt = -Infinity;
  #drawn = false;
  #finished = false;

  /**
   * @param label shown first on the line, usually the file name
   * @param total announced size in bytes, if known
   * @param startBytes bytes already present when this run began (a resumed `.part`)
   */
  constructor(
    label: string,
    total: number | undefined,
    startBytes: number,
    options: ProgressOptions = {},
  ) {
    this.#label = label;
    this.#total = total;
    this.#startBytes = startBytes;
    const terminal = options.sink === undefined && !options.force && Deno.stderr.isTerminal();
    this.#lines = options.mode === "lines" ||
      (options.mode === undefined && options.sink === undefined && !options.force && !terminal);
    this.#write = options.sink ?? writeStderr;
    this.#intervalMs = options.intervalMs ?? (this.#lines ? 5000 : 100);
    this.#now = options.now ?? (() => performance.now());
    this.#startedAt = this.#now();
    if (this.#lines) this.#lastDrawAt = this.#startedAt;
  }

  /** Whether this bar draws anything at all. */
  get enabled(): boolean {
    return this.#write !== undefined;
  }

  /** Reports `received` bytes present so far; redraws at most once per interval. */
  update(received: number): void {
    if (this.#write === undefined || this.#finished) return;
    const now = this.#now();
    if (now - this.#lastDrawAt < this.#intervalMs) return;
    this.#lastDrawAt = now;
    this.#drawn = true;
    this.#write(
      this.#lines ? `${this.#line(received, now)}\n` : `\r${this.#line(received, now)}\x1b[K`,
    );
  }

  /** Draws the final state and ends the line. Later calls do nothing. */
  finish(received: number): void {
    if (this.#write === undefined || this.#finished) return;
    this.#finished = true;
    if (this.#lines) {
      if (this.#drawn) this.#write(`${this.#line(received, this.#now())}\n`);
      return;
    }
    this.#write(`\r${this.#line(received, this.#now())}\x1b[K\n`);
  }

  #line(received: number, now: number): string {
    return formatProgress({
      label: this.#label,
      received,
      total: this.#total,
      transferred: received - this.#startBytes,
      elapsedMs: now - this.#startedAt,
    });
  }
}

const encoder = new TextEncoder();

function writeStderr(text: string): void {
  const bytes = encoder.encode(text);
  let offset = 0;
  while (offset < bytes.length) offset += Deno.stderr.writeSync(bytes.subarray(offset));
}
