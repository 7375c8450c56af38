import { derivedSeed, parseBatchLines } from "./batch_lines.ts";
import { type BatchStore, newId, type ResultLog } from "./batch_store.ts";
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
}

/**
 * The one owner of every batch's state: it starts lines while fewer than `maxInFlight` run
 * (so interactive traffic keeps the capacity it needs), records each finished line in the
 * batch's results log before counting it, and writes the output and error files at the end.
 * Lines are taken in order, oldest batch first. A line that finds the server overloaded is
 * tried again; one cut off (cancel, shutdown) is not recorded, so a restart runs it again.
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

  /** Lines generating now, over all batches. */
  get inFlight(): number {
    return this.#inFlight;
  }

  /** Stores a validated batch and starts running it. */
  async start(batch: BatchObject, lines: readonly BatchLine[]): Promise<void> {
    this.#batches.set(batch.id, batch);
    await this.#store.saveBatch(batch);
    await this.#activate(batch, lines, "completed");
    this.#pump();
  }

  /** Records a batch that failed validation. */
  async record(batch: BatchObject): Promise<void> {
    this.#batches.set(batch.id, batch);
    await this.#store.saveBatch(batch);
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
    await this.#store.saveBatch(a.batch);
    for (const ctrl of a.running.values()) ctrl.abort("batch cancelled");
    await this.#settle(a);
    return a.batch;
  }

  /** The server is shutting down: no more lines start; running ones are cut off. */
  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#retryTimer);
    for (const a of this.#active.values()) {
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
    const body = line.body.seed === undefined || line.body.seed === null
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
    try {
      await a.log.append(line.index, ok, out);
    } catch (e) {
      // The disk refused the record: the line is not done; it runs again after a restart.
      this.#opts.log?.(
        `batch ${a.batch.id}: cannot record line ${line.index}: ${(e as Error).message}`,
      );
      return;
    }
    if (ok) a.batch.request_counts.completed++;
    else a.batch.request_counts.failed++;
  }

  async #expire(a: Active): Promise<void> {
    const left = a.pending;
    a.pending = [];
    a.ending = "expired";
    for (const index of left) {
      const line = a.lines[index]!;
      await a.log.append(index, false, {
        id: newId("batch_req_"),
        custom_id: line.customId,
        response: null,
        error: {
          code: "batch_expired",
          message: "This request could not be executed before the completion window expired.",
        },
      });
      a.batch.request_counts.failed++;
    }
    await this.#settle(a);
  }

  /** Once nothing of a batch runs and nothing is left to start, writes its files and ends it. */
  async #settle(a: Active): Promise<void> {
    if (a.finalizing || a.running.size > 0 || a.pending.length > 0 || this.#closed) return;
    a.finalizing = true;
    const b = a.batch;
    try {
      if (a.ending === "completed" && b.status !== "finalizing") {
        b.status = "finalizing";
        b.finalizing_at = this.#now();
        await this.#store.saveBatch(b);
      }
      await a.log.close();
      const records = [...a.log.records].filter((r) => r.index < a.lines.length)
        .sort((x, y) => x.index - y.index);
      const stem = b.id.slice("batch_".length);
      const write = async (ok: boolean, suffix: string): Promise<string | null> => {
        const rows = records.filter((r) => r.ok === ok);
        if (rows.length === 0) return null;
        const content = new TextEncoder().encode(
          rows.map((r) => JSON.stringify(r.line) + "\n").join(""),
        );
        const meta: FileObject = {
          id: `file-${stem}-${suffix}`,
          object: "file",
          bytes: content.length,
          created_at: this.#now(),
          filename: `${b.id}_${suffix}.jsonl`,
          purpose: "batch_output",
          status: "processed",
          ...(b.scope === undefined ? {} : { scope: b.scope }),
        };
        await this.#store.putFile(meta, content);
        return meta.id;
      };
      b.output_file_id = await write(true, "output");
      b.error_file_id = await write(false, "error");
      const now = this.#now();
      b.status = a.ending;
      if (a.ending === "completed") b.completed_at = now;
      else if (a.ending === "cancelled") b.cancelled_at = now;
      else b.expired_at = now;
      await this.#store.saveBatch(b);
      this.#active.delete(b.id);
    } catch (e) {
      // Left as it is on disk: a restart finishes it.
      this.#opts.log?.(`batch ${b.id}: cannot finish: ${(e as Error).message}`);
      this.#active.delete(b.id);
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
