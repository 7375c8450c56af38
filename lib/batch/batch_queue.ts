import type { Hono } from "hono";
import type { AppContext } from "../http/app.ts";
import { z } from "zod";
import { ApiError, toApiError } from "../http/errors.ts";
import { PARAM_FIELDS } from "../http/request_params.ts";
import { parseWith } from "../http/validation.ts";
import { BatchRunner, type LineExecutor } from "./batch_runner.ts";
import { type BatchLimits, registerBatchRoutes } from "./batch_routes.ts";
import { BatchStore } from "./batch_store.ts";
import { batchLineBytes } from "./jsonl_check.ts";
import { StorageQuota } from "./storage_quota.ts";
import { UploadSlots } from "./upload_slots.ts";

export interface BatchQueueOptions extends BatchLimits {
  /** Where files and results live. */
  readonly dataDir: string;
  /** Batch lines generating at once (the bound that keeps interactive TTFT). */
  readonly maxInFlight: number;
  /** Uploads streaming at once: over the server, and for one API key. */
  readonly maxUploads: number;
  readonly maxUploadsPerKey: number;
  /** Each key's share of the data folder: bytes and files. */
  readonly maxStorageBytes: number;
  readonly maxFiles: number;
  /** How long a finished batch's files are kept, in ms (Infinity: until deleted). */
  readonly retentionMs: number;
  readonly log?: (line: string) => void;
}

/**
 * The batch queue as the server mounts it: the store in the data directory, the runner, and
 * the routes. Pass `attach` as createApp's `extend`; it resumes the stored batches.
 */
export class BatchQueue {
  readonly store: BatchStore;
  #runner: BatchRunner | undefined;
  readonly #opts: BatchQueueOptions;
  #sweep: ReturnType<typeof setInterval> | undefined;
  #closed = false;

  constructor(opts: BatchQueueOptions) {
    this.#opts = opts;
    this.store = new BatchStore(opts.dataDir);
  }

  get runner(): BatchRunner | undefined {
    return this.#runner;
  }

  readonly attach = (app: Hono, ctx: AppContext): void => {
    const runner = new BatchRunner(this.store, lineExecutor(ctx), {
      maxInFlight: this.#opts.maxInFlight,
      ...(this.#opts.log ? { log: this.#opts.log } : {}),
    });
    this.#runner = runner;
    const ready = runner.resume().then((n) => {
      if (n > 0) {
        this.#opts.log?.(`batches: resumed ${n} unfinished batch(es) from ${this.#opts.dataDir}`);
      }
    }).catch((e) => {
      this.#opts.log?.(
        `batches: cannot resume from ${this.#opts.dataDir}: ${(e as Error).message}`,
      );
    });
    registerBatchRoutes(app, {
      store: this.store,
      runner,
      limits: { ...this.#opts, maxLineBytes: batchLineBytes(ctx.maxBodyBytes) },
      uploads: new UploadSlots({
        perServer: this.#opts.maxUploads,
        perKey: this.#opts.maxUploadsPerKey,
      }),
      quota: new StorageQuota(
        { maxBytes: this.#opts.maxStorageBytes, maxFiles: this.#opts.maxFiles },
        (scope) => this.store.usage(scope),
      ),
      ready,
      scopeOf: ctx.scopeOf,
    });
    void ready.then(() => this.#expireEvery(runner));
  };

  /** Runs the retention sweep now and then: every half retention, within 250 ms to 1 min. */
  #expireEvery(runner: BatchRunner): void {
    const retention = this.#opts.retentionMs;
    if (!Number.isFinite(retention) || this.#closed) return;
    const sweep = () =>
      runner.expireFiles(retention).catch((e) =>
        this.#opts.log?.(`batches: cannot expire files: ${(e as Error).message}`)
      );
    void sweep();
    this.#sweep = setInterval(sweep, Math.min(60_000, Math.max(250, retention / 2)));
    Deno.unrefTimer(this.#sweep);
  }

  async close(): Promise<void> {
    this.#closed = true;
    clearInterval(this.#sweep);
    await this.#runner?.close();
  }
}

/** A line's own priority, checked as the endpoint checks it before the line's is set. */
const LinePriority = z.object({ priority: PARAM_FIELDS.priority.nullish() });

/**
 * A line runs as the same request sent to the endpoint would, with two differences a batch
 * needs: its priority is `batch` whatever valid one it asks, and it cannot stream.
 */
function lineExecutor(ctx: AppContext): LineExecutor {
  return async (endpoint, body, scope, signal) => {
    try {
      parseWith(LinePriority, body);
    } catch (e) {
      const err = toApiError(e);
      return { status: err.status, body: err.toJSON() };
    }
    if (body.stream === true) {
      const e = new ApiError(
        "invalid_request",
        "Invalid 'stream': a batch request cannot stream (send false or leave it out); got true",
        "stream",
      );
      return { status: e.status, body: e.toJSON() };
    }
    const text = JSON.stringify({ ...body, priority: "batch" });
    const bytes = new TextEncoder().encode(text).length;
    if (bytes > ctx.maxBodyBytes) {
      const e = new ApiError(
        "payload_too_large",
        `Request body is ${bytes} bytes; the limit is ${ctx.maxBodyBytes} bytes`,
      );
      return { status: e.status, body: e.toJSON() };
    }
    const req = new Request(`http://batch.internal${endpoint}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: text,
      signal,
    });
    try {
      const kind = endpoint === "/v1/completions"
        ? "completions"
        : endpoint === "/v1/embeddings"
        ? "embeddings"
        : endpoint === "/v1/messages"
        ? "messages"
        : "chat_completions";
      const res = await ctx.openAi(req, kind, scope);
      return { status: res.status, body: await res.json() };
    } catch (e) {
      const err = toApiError(e);
      return { status: err.status, body: err.toJSON() };
    }
  };
}
