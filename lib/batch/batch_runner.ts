import { derivedSeed, parseBatchLines } from "./batch_lines.ts";
import { type BatchStore, newId, type ResultLog } from "./batch_store.ts";
import { diskErrorMessage } from "./disk_full.ts";
import {
  type BatchEndpoint,
  type BatchLine,
  type BatchObject,
  type FileObject,
  type OutputLine,
  TERMINAL_STATUSES,
} from "./batch_types.ts";

/** What running one line gave: the HTTP status and JSON body the same request would get. */
export interface LineOutcome {
  readonly status: number;
  readonly body: unknown;
}

/**
 * Runs one request line through the HTTP API's generation path at batch priority. It resolves
 * with the answer (errors included) and never rejects for a bad request.
 */
export type LineExecutor = (
  endpoint: BatchEndpoint,
  body: Record<string, unknown>,
  scope: string | undefined,
  signal: AbortSignal,
) => Promise<LineOutcome>;

export interface RunnerOptions {
  /** Batch lines generating at once, over all batches. */
  readonly maxInFlight: number;
  /** Wait before trying again after an overloaded (503) answer (default 200 ms). */
  readonly retryDelayMs?: number;
  /** Wait before writing results again after the disk refused them (default 1 s). */
  readonly diskRetryMs?: number;
  /** Unix seconds (tests move it to expire a batch). */
  readonly now?: () => number;
  readonly log?: (line: string) => void;
}

/** How a batch that stops taking new lines ends once its running lines have settled. */
type Ending = "completed" | "cancelled" | "expired";

/** A batch that is not finished: its lines, its results log and the lines left to run. */
interface Active {
  readonly batch: BatchObject;
  readonly lines: readonly BatchLine[];
  readonly log: ResultLog;
  /** Indices not yet run, in file order. */
  pending: number[];
  readonly running: Map<number, AbortController>;
  ending: Ending;
  finalizing: boolean;
  /**
   * Finished lines the disk refused, in order: written again (before any new line starts)
   * once the disk takes them. Only then do they count, and only then can the batch end.
   */
  readonly stalled: { index: number; ok: boolean; line: OutputLine }[];
  /** The timer that tries the disk again, while it refuses this batch's writes. */
  diskRetry: ReturnType<typeof setTimeout> | undefined;
}

/**
 * The one owner of every batch's state: it starts lines while fewer than `maxInFlight` run
 * (so interactive traffic keeps the capacity it needs), records each finished line in the
 * batch's results log before counting it, and makes the output and error files (views of the
 * log) at the end. Lines are taken in order, oldest batch first. A line that finds the server
 * overloaded is tried again; one cut off (cancel, shutdown) is not recorded, so a restart runs
 * it again. While the disk refuses a batch's writes (full), the batch's `errors` say so, it
 * starts no line, and it tries again every `diskRetryMs` until the disk takes them.
 */
export class BatchRunner {
  readonly #store: BatchStore;
  readonly #exec: LineExecutor;
  readonly #opts: RunnerOptions;
  /** Every batch by id: the finished ones as their objects, the others also in #active. */
  readonly #batches = new Map<string, BatchObject>();
  readonly #active = new Map<string, Active>();
  #inFlight = 0;
  /** The server is draining: no more lines start. */
  #paused = false;
  #closed = false;
  #retryTimer: ReturnType<typeof setTimeout> | undefined;
  /** Finished batches whose files expireFiles() already removed. */
  readonly #expired = new Set<string>();

  constructor(store: BatchStore, exec: LineExecutor, opts: RunnerOptions) {
    this.#store = store;
    this.#exec = exec;
    this.#opts = opts;
  }

  #now(): number {
    return this.#opts.now?.() ?? Math.floor(Date.now() / 1000);
  }

  /** Loads the stored batches and resumes the unfinished ones where their logs left off. */
  async resume(): Promise<number> {
    let resumed = 0;
    await this.#store.removeTemporaries();
    for (const b of await this.#store.listBatches()) {
      this.#batches.set(b.id, b);
      if (TERMINAL_STATUSES.has(b.status)) continue;
      const content = await this.#store.fileContent(b.input_file_id);
      if (content === undefined) {
        await this.#fail(b, "input_file_missing", `The input file ${b.input_file_id} is gone`);
        continue;
      }
      const { lines } = parseBatchLines(new TextDecoder().decode(content), b.endpoint);
      const ending: Ending = b.status === "cancelling" ? "cancelled" : "completed";
      await this.#activate(b, lines, ending);
      resumed++;
    }
    this.#pump();
    return resumed;
  }

  get(id: string): BatchObject | undefined {
    return this.#batches.get(id);
  }

  /** Newest first, as OpenAI lists them. */
  list(): BatchObject[] {
    return [...this.#batches.values()].reverse();
  }

  /** Batches not yet in a final status. */
  get activeCount(): number {
    return this.#active.size;
  }

  /** The unfinished batch that reads this input file, if any. */
  readerOf(fileId: string): BatchObject | undefined {
    for (const a of this.#active.values()) if (a.batch.input_file_id === fileId) return a.batch;
    return undefined;
  }

  /**
   * Deletes the files of batches that finished `retentionMs` or more ago: the output and error
   * files with their results log, and the input file unless an unfinished batch reads it. The
   * batch objects stay (their file ids then answer 404). Returns how many files went.
   */
  async expireFiles(retentionMs: number): Promise<number> {
    const now = this.#now();
    let removed = 0;
    for (const b of [...this.#batches.values()]) {
      if (!TERMINAL_STATUSES.has(b.status) || this.#expired.has(b.id)) continue;
      const end = b.completed_at ?? b.cancelled_at ?? b.expired_at ?? b.failed_at;
      if (end === null || (now - end) * 1000 < retentionMs) continue;
      const input = this.readerOf(b.input_file_id) === undefined ? b.input_file_id : null;
      for (const id of [b.output_file_id, b.error_file_id, input]) {
        const f = id === null ? undefined : await this.#store.getFile(id);
        if (f === undefined) continue;
        await this.#store.deleteFile(f);
        removed++;
      }
      await this.#store.removeResults(b.id);
      this.#expired.add(b.id);
    }
    return removed;
  }

  /** Lines generating now, over all batches. */
  get inFlight(): number {
    return this.#inFlight;
  }

  /** Stores a validated batch and starts running it. */
  async start(batch: BatchObject, lines: readonly BatchLine[]): Promise<void> {
    // Saved first: a batch the disk refused does not exist.
    await this.#store.saveBatch(batch);
    this.#batches.set(batch.id, batch);
    await this.#activate(batch, lines, "completed");
    this.#pump();
  }

  /** Records a batch that failed validation. */
  async record(batch: BatchObject): Promise<void> {
    await this.#store.saveBatch(batch);
    this.#batches.set(batch.id, batch);
  }

  /**
   * Stops a batch: no more of its lines start, the running ones are cut off (not recorded),
   * and it ends `cancelled` with output and error files of the lines done so far.
   */
  async cancel(id: string): Promise<BatchObject | undefined> {
    const a = this.#active.get(id);
    if (a === undefined) return this.#batches.get(id);
    if (a.batch.status === "cancelling" || a.batch.status === "finalizing") return a.batch;
    a.batch.status = "cancelling";
    a.batch.cancelling_at = this.#now();
    a.ending = "cancelled";
    a.pending = [];
    // The cancel holds even if the disk refuses the object now: it is saved when the batch ends.
    await this.#store.saveBatch(a.batch).catch((e) => this.#diskRefused(a, e));
    for (const ctrl of a.running.values()) ctrl.abort("batch cancelled");
    await this.#settle(a);
    return a.batch;
  }

  /** The server is shutting down: no more lines start; running ones are cut off. */
  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#retryTimer);
    for (const a of this.#active.values()) {
      clearTimeout(a.diskRetry);
      for (const ctrl of a.running.values()) ctrl.abort("server stopping");
    }
    for (const a of this.#active.values()) await a.log.close();
  }

  async #activate(b: BatchObject, lines: readonly BatchLine[], ending: Ending): Promise<void> {
    const log = await this.#store.openResults(b.id);
    const done = log.records.filter((r) => r.index < lines.length);
    b.request_counts = {
      total: lines.length,
      completed: done.filter((r) => r.ok).length,
      failed: done.filter((r) => !r.ok).length,
    };
    const a: Active = {
      batch: b,
      lines,
      log,
      pending: ending === "completed" && b.status === "in_progress"
        ? lines.map((l) => l.index).filter((i) => !log.has(i))
        : [],
      running: new Map(),
      ending,
      finalizing: false,
      stalled: [],
      diskRetry: undefined,
    };
    this.#active.set(b.id, a);
    if (a.pending.length === 0) await this.#settle(a);
  }

  #pump(): void {
    if (this.#paused || this.#closed || this.#retryTimer !== undefined) return;
    while (this.#inFlight < this.#opts.maxInFlight) {
      const next = this.#nextLine();
      if (next === undefined) return;
      this.#launch(next.a, next.index);
    }
  }

  #nextLine(): { a: Active; index: number } | undefined {
    for (const a of this.#active.values()) {
      if (a.batch.status !== "in_progress" || a.pending.length === 0) continue;
      if (a.stalled.length > 0) continue;
      if (this.#now() >= a.batch.expires_at) {
        void this.#expire(a);
        continue;
      }
      return { a, index: a.pending.shift()! };
    }
    return undefined;
  }

  #launch(a: Active, index: number): void {
    const line = a.lines[index]!;
    const ctrl = new AbortController();
    a.running.set(index, ctrl);
    this.#inFlight++;
    // A sampled line without a seed gets one of its own, so running it again gives the same
    // answer; embeddings sample nothing, and Anthropic's Messages have no seed field.
    const seedless = line.body.seed === undefined || line.body.seed === null;
    const seeded = a.batch.endpoint === "/v1/completions" ||
      a.batch.endpoint === "/v1/chat/completions";
    const body = seedless && seeded
      ? { ...line.body, seed: derivedSeed(a.batch.id, index) }
      : line.body;
    void (async () => {
      let outcome: LineOutcome;
      try {
        outcome = await this.#exec(a.batch.endpoint, body, a.batch.scope, ctrl.signal);
      } catch (e) {
        outcome = {
          status: 500,
          body: errorBody("internal", `Internal error: ${(e as Error).message ?? e}`),
        };
      }
      a.running.delete(index);
      this.#inFlight--;
      if (this.#closed) return;
      if (ctrl.signal.aborted) {
        // Cut off by a cancel: not done, and not to be run again.
      } else if (outcome.status === 503) {
        // Overloaded, draining or loading: not the line's fault. Run it again later.
        a.pending.unshift(index);
        if (errorCode(outcome.body) === "draining") this.#paused = true;
        else this.#backOff();
      } else {
        await this.#recordLine(a, line, outcome);
      }
      await this.#settle(a);
      this.#pump();
    })();
  }

  #backOff(): void {
    if (this.#retryTimer !== undefined) return;
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = undefined;
      this.#pump();
    }, this.#opts.retryDelayMs ?? 200);
  }

  async #recordLine(a: Active, line: BatchLine, outcome: LineOutcome): Promise<void> {
    const ok = outcome.status >= 200 && outcome.status < 300;
    const requestId = ok && typeof (outcome.body as { id?: unknown })?.id === "string"
      ? (outcome.body as { id: string }).id
      : newId("batch_req_").replace("batch_req_", "req_");
    const out: OutputLine = {
      id: newId("batch_req_"),
      custom_id: line.customId,
      response: { status_code: outcome.status, request_id: requestId, body: outcome.body },
      error: null,
    };
    await this.#write(a, { index: line.index, ok, line: out });
  }

  /**
   * Records a finished line in the batch's results log and counts it. If the disk refuses it,
   * the record waits in `stalled` (so it is not in the log, nor in the output file, nor
   * counted) and the disk is tried again later; records after it wait behind it.
   */
  async #write(a: Active, r: { index: number; ok: boolean; line: OutputLine }): Promise<void> {
    if (a.stalled.length > 0) {
      a.stalled.push(r);
      return;
    }
    try {
      await a.log.append(r.index, r.ok, r.line);
    } catch (e) {
      a.stalled.push(r);
      this.#diskRefused(a, e);
      return;
    }
    if (r.ok) a.batch.request_counts.completed++;
    else a.batch.request_counts.failed++;
  }

  /** The disk refused a write: the batch says why, and tries again in a while. */
  #diskRefused(a: Active, e: unknown): void {
    const message = diskErrorMessage(this.#store.dir, e);
    this.#opts.log?.(`batch ${a.batch.id}: ${message}`);
    a.batch.errors = {
      object: "list",
      data: [{ code: "insufficient_storage", message, param: null, line: null }],
    };
    // Kept in memory for GET; on disk too if there is room for the small object.
    void this.#store.saveBatch(a.batch).catch(() => {});
    if (a.diskRetry !== undefined || this.#closed) return;
    a.diskRetry = setTimeout(() => {
      a.diskRetry = undefined;
      void this.#retryDisk(a);
    }, this.#opts.diskRetryMs ?? 1000);
  }

  /** Writes the stalled records again; once all are in, the batch goes on where it was. */
  async #retryDisk(a: Active): Promise<void> {
    if (this.#closed) return;
    while (a.stalled.length > 0) {
      const r = a.stalled[0]!;
      try {
        await a.log.append(r.index, r.ok, r.line);
      } catch (e) {
        this.#diskRefused(a, e);
        return;
      }
      a.stalled.shift();
      if (r.ok) a.batch.request_counts.completed++;
      else a.batch.request_counts.failed++;
    }
    if (a.batch.errors?.data[0]?.code === "insufficient_storage") a.batch.errors = null;
    try {
      await this.#store.saveBatch(a.batch);
    } catch (e) {
      this.#diskRefused(a, e);
      return;
    }
    await this.#settle(a);
    this.#pump();
  }

  async #expire(a: Active): Promise<void> {
    const left = a.pending;
    a.pending = [];
    a.ending = "expired";
    for (const index of left) {
      const line = a.lines[index]!;
      await this.#write(a, {
        index,
        ok: false,
        line: {
          id: newId("batch_req_"),
          custom_id: line.customId,
          response: null,
          error: {
            code: "batch_expired",
            message: "This request could not be executed before the completion window expired.",
          },
        },
      });
    }
    await this.#settle(a);
  }

  /** Once nothing of a batch runs and nothing is left to start, writes its files and ends it. */
  async #settle(a: Active): Promise<void> {
    if (
      a.finalizing || a.running.size > 0 || a.pending.length > 0 || a.stalled.length > 0 ||
      this.#closed
    ) return;
    a.finalizing = true;
    const b = a.batch;
    try {
      if (a.ending === "completed" && b.status !== "finalizing") {
        b.status = "finalizing";
        b.finalizing_at = this.#now();
        await this.#store.saveBatch(b);
      }
      await a.log.close();
      const records = a.log.records.filter((r) => r.index < a.lines.length);
      const stem = b.id.slice("batch_".length);
      const encoder = new TextEncoder();
      // The files are views of the results log (its one copy): only their objects are written.
      const write = async (ok: boolean, suffix: string): Promise<string | null> => {
        const rows = records.filter((r) => r.ok === ok);
        if (rows.length === 0) return null;
        const bytes = rows.reduce(
          (n, r) => n + encoder.encode(JSON.stringify(r.line)).length + 1,
          0,
        );
        const meta: FileObject = {
          id: `file-${stem}-${suffix}`,
          object: "file",
          bytes,
          created_at: this.#now(),
          filename: `${b.id}_${suffix}.jsonl`,
          purpose: "batch_output",
          status: "processed",
          ...(b.scope === undefined ? {} : { scope: b.scope }),
          results: { batch: b.id, ok, lines: a.lines.length },
        };
        await this.#store.putResultFile(meta);
        return meta.id;
      };
      const output_file_id = await write(true, "output");
      const error_file_id = await write(false, "error");
      // The final status shows once it is on disk: a refused save leaves the batch as it was.
      const now = this.#now();
      const ended: BatchObject = { ...b, status: a.ending, output_file_id, error_file_id };
      if (b.errors?.data[0]?.code === "insufficient_storage") ended.errors = null;
      if (a.ending === "completed") ended.completed_at = now;
      else if (a.ending === "cancelled") ended.cancelled_at = now;
      else ended.expired_at = now;
      await this.#store.saveBatch(ended);
      Object.assign(b, ended);
      this.#active.delete(b.id);
    } catch (e) {
      // Not finished: tried again once the disk takes writes (a restart would finish it too).
      a.finalizing = false;
      this.#diskRefused(a, e);
    }
  }

  async #fail(b: BatchObject, code: string, message: string): Promise<void> {
    b.status = "failed";
    b.failed_at = this.#now();
    b.errors = { object: "list", data: [{ code, message, param: null, line: null }] };
    await this.#store.saveBatch(b);
  }
}

function errorBody(code: string, message: string) {
  return { error: { message, type: "server_error", param: null, code } };
}

function errorCode(body: unknown): string | undefined {
  const code = (body as { error?: { code?: unknown } } | null)?.error?.code;
  return typeof code === "string" ? code : undefined;
}
