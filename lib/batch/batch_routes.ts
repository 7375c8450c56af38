import type { Hono } from "hono";
import { z } from "zod";
import { readJsonBody } from "../http/body.ts";
import { ApiError, preview } from "../http/errors.ts";
import { parseWith } from "../http/validation.ts";
import { parseBatchLines } from "./batch_lines.ts";
import type { BatchRunner } from "./batch_runner.ts";
import { type BatchStore, newId } from "./batch_store.ts";
import { insufficientStorage, isDiskFull, storing } from "./disk_full.ts";
import { receiveUpload } from "./multipart_upload.ts";
import type { StorageQuota } from "./storage_quota.ts";
import type { UploadSlots } from "./upload_slots.ts";
import {
  BATCH_ENDPOINTS,
  type BatchObject,
  type FileObject,
  publicBatch,
  publicFile,
  TERMINAL_STATUSES,
  visibleTo,
} from "./batch_types.ts";

export interface BatchLimits {
  /** Largest input file, in bytes. */
  readonly maxFileBytes: number;
  /** Most request lines in one input file. */
  readonly maxLines: number;
  /** Most batches not yet finished at once. */
  readonly maxActive: number;
}

export interface BatchRouteDeps {
  readonly store: BatchStore;
  readonly runner: BatchRunner;
  /** With the longest request line, in bytes (from the server's body limit: batchLineBytes). */
  readonly limits: BatchLimits & { readonly maxLineBytes: number };
  readonly uploads: UploadSlots;
  readonly quota: StorageQuota;
  /** Resolves once stored batches are loaded (routes wait for it). */
  readonly ready: Promise<unknown>;
  readonly scopeOf: (req: Request) => string | undefined;
}

const CreateBatchBody = z.strictObject({
  input_file_id: z.string().min(1),
  endpoint: z.enum(BATCH_ENDPOINTS, {
    error: `expected one of ${BATCH_ENDPOINTS.map((e) => `"${e}"`).join(", ")}`,
  }),
  completion_window: z.literal("24h", { error: 'only "24h" is supported' }),
  metadata: z.record(z.string().max(64), z.string().max(512)).refine(
    (m) => Object.keys(m).length <= 16,
    { error: "at most 16 metadata keys" },
  ).nullish(),
  output_expires_after: z.unknown().optional(),
});

/**
 * OpenAI's Files and Batch endpoints: POST /v1/files (multipart, purpose "batch"),
 * GET /v1/files, GET /v1/files/{id}, GET /v1/files/{id}/content, DELETE /v1/files/{id},
 * POST /v1/batches, GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel.
 */
export function registerBatchRoutes(app: Hono, deps: BatchRouteDeps): void {
  const { store, runner, limits } = deps;

  app.post("/v1/files", async (c) => {
    await deps.ready;
    const scope = deps.scopeOf(c.req.raw);
    const release = deps.uploads.acquire(scope);
    try {
      return c.json(publicFile(await upload(c.req.raw, scope)));
    } finally {
      release();
    }
  });

  /** Streams the upload to a temporary file, checks it, and stores it; or leaves nothing. */
  const upload = async (req: Request, scope: string | undefined): Promise<FileObject> => {
    const declared = Number(req.headers.get("content-length") ?? "NaN");
    const reservation = await deps.quota.begin(
      scope,
      Number.isFinite(declared) ? declared : undefined,
    );
    const id = newId("file-");
    let path: string | undefined;
    try {
      path = await store.uploadPath(id);
      const got = await receiveUpload(req, path, limits, (n) => reservation.add(n));
      const purpose = got.fields.get("purpose");
      if (purpose !== "batch") {
        throw new ApiError(
          "invalid_request",
          `Invalid 'purpose': this server takes files for batches only (send "batch"); got ${
            preview(purpose)
          }`,
          "purpose",
        );
      }
      const meta: FileObject = {
        id,
        object: "file",
        bytes: got.bytes,
        created_at: Math.floor(Date.now() / 1000),
        filename: got.filename || "input.jsonl",
        purpose: "batch",
        status: "processed",
        lines: got.lines,
        ...scopeField(scope),
      };
      await store.commitUpload(meta, path);
      return meta;
    } catch (e) {
      if (path !== undefined) await Deno.remove(path).catch(() => {});
      if (isDiskFull(e)) throw insufficientStorage(store.dir, e, "the file was not stored");
      throw e;
    } finally {
      reservation.end();
    }
  };

  const fileOr404 = async (id: string, req: Request): Promise<FileObject> => {
    const f = await store.getFile(id);
    if (f === undefined || !visibleTo(f.scope, deps.scopeOf(req))) {
      throw new ApiError("not_found", `No file with id ${preview(id)}`, "file_id");
    }
    return f;
  };
  app.get("/v1/files", async (c) => {
    const purpose = c.req.query("purpose");
    const asker = deps.scopeOf(c.req.raw);
    const files = (await store.listFiles()).filter((f) =>
      (purpose === undefined || f.purpose === purpose) && visibleTo(f.scope, asker)
    );
    return c.json({ object: "list", data: files.map(publicFile), has_more: false });
  });
  app.get(
    "/v1/files/:id",
    async (c) => c.json(publicFile(await fileOr404(c.req.param("id"), c.req.raw))),
  );
  app.get("/v1/files/:id/content", async (c) => {
    await fileOr404(c.req.param("id"), c.req.raw);
    const content = await store.contentStream(c.req.param("id"));
    if (content === undefined) {
      throw new ApiError("not_found", `No file with id ${preview(c.req.param("id"))}`, "file_id");
    }
    return new Response(content, { headers: { "content-type": "application/jsonl" } });
  });
  app.delete("/v1/files/:id", async (c) => {
    await deps.ready;
    const f = await fileOr404(c.req.param("id"), c.req.raw);
    const reader = runner.readerOf(f.id);
    if (reader !== undefined) {
      throw new ApiError(
        "conflict",
        `File ${f.id} is the input of batch ${reader.id}, which is ${reader.status}; ` +
          `cancel the batch or wait for it to finish before deleting the file`,
        "file_id",
      );
    }
    await store.deleteFile(f);
    return c.json({ id: f.id, object: "file", deleted: true });
  });

  app.post("/v1/batches", async (c) => {
    await deps.ready;
    const body = parseWith(CreateBatchBody, await readJsonBody(c.req.raw, 1 << 20));
    const input = await store.getFile(body.input_file_id);
    if (input === undefined || !visibleTo(input.scope, deps.scopeOf(c.req.raw))) {
      throw new ApiError(
        "not_found",
        `Invalid 'input_file_id': no file with id ${
          preview(body.input_file_id)
        }; upload it with POST /v1/files first`,
        "input_file_id",
      );
    }
    if (input.purpose !== "batch") {
      throw new ApiError(
        "invalid_request",
        `Invalid 'input_file_id': ${input.id} has purpose "${input.purpose}", not "batch"`,
        "input_file_id",
      );
    }
    if (runner.activeCount >= limits.maxActive) {
      throw new ApiError(
        "too_many_batches",
        `${runner.activeCount} batches are already unfinished, the most this server runs at once ` +
          `(--batch-max-active ${limits.maxActive}); wait for one to finish or cancel one`,
      );
    }
    const content = (await store.fileContent(input.id))!;
    const { lines, errors } = parseBatchLines(new TextDecoder().decode(content), body.endpoint);
    if (lines.length > limits.maxLines) {
      throw new ApiError(
        "invalid_request",
        `The input file has ${lines.length} request lines; the limit is ${limits.maxLines} (--batch-max-lines)`,
        "input_file_id",
      );
    }
    const now = Math.floor(Date.now() / 1000);
    const batch: BatchObject = {
      id: newId("batch_"),
      object: "batch",
      endpoint: body.endpoint,
      errors: null,
      input_file_id: input.id,
      completion_window: "24h",
      status: "in_progress",
      output_file_id: null,
      error_file_id: null,
      created_at: now,
      in_progress_at: now,
      expires_at: now + 24 * 3600,
      finalizing_at: null,
      completed_at: null,
      failed_at: null,
      expired_at: null,
      cancelling_at: null,
      cancelled_at: null,
      request_counts: { total: lines.length, completed: 0, failed: 0 },
      metadata: body.metadata ?? null,
    };
    const scope = deps.scopeOf(c.req.raw);
    if (scope !== undefined) batch.scope = scope;
    if (errors.length > 0) {
      batch.status = "failed";
      batch.in_progress_at = null;
      batch.failed_at = now;
      batch.errors = { object: "list", data: errors };
      batch.request_counts = { total: 0, completed: 0, failed: 0 };
      await storing(store.dir, "the batch was not created", () => runner.record(batch));
    } else {
      await storing(store.dir, "the batch was not created", () => runner.start(batch, lines));
    }
    return c.json(publicBatch(batch));
  });

  const batchOr404 = (id: string, req: Request): BatchObject => {
    const b = runner.get(id);
    if (b === undefined || !visibleTo(b.scope, deps.scopeOf(req))) {
      throw new ApiError("not_found", `No batch with id ${preview(id)}`, "batch_id");
    }
    return b;
  };
  app.get("/v1/batches", async (c) => {
    await deps.ready;
    const limitText = c.req.query("limit");
    const limit = limitText === undefined ? 20 : Number(limitText);
    if (!Number.isInteger(limit) || limit < 1 || limit > 100) {
      throw new ApiError(
        "invalid_request",
        `Invalid 'limit': expected an integer from 1 to 100; got ${preview(limitText)}`,
        "limit",
      );
    }
    const asker = deps.scopeOf(c.req.raw);
    let all = runner.list().filter((b) => visibleTo(b.scope, asker));
    const after = c.req.query("after");
    if (after !== undefined) {
      const at = all.findIndex((b) => b.id === after);
      if (at < 0) {
        throw new ApiError(
          "not_found",
          `Invalid 'after': no batch with id ${preview(after)}`,
          "after",
        );
      }
      all = all.slice(at + 1);
    }
    const data = all.slice(0, limit).map(publicBatch);
    return c.json({
      object: "list",
      data,
      first_id: data[0]?.id ?? null,
      last_id: data.at(-1)?.id ?? null,
      has_more: all.length > limit,
    });
  });
  app.get("/v1/batches/:id", async (c) => {
    await deps.ready;
    return c.json(publicBatch(batchOr404(c.req.param("id"), c.req.raw)));
  });
  app.post("/v1/batches/:id/cancel", async (c) => {
    await deps.ready;
    const b = batchOr404(c.req.param("id"), c.req.raw);
    if (TERMINAL_STATUSES.has(b.status)) {
      throw new ApiError(
        "conflict",
        `Batch ${b.id} is already ${b.status} and cannot be cancelled`,
        "batch_id",
      );
    }
    const cancelled = await storing(
      store.dir,
      "the batch was not cancelled",
      () => runner.cancel(b.id),
    );
    return c.json(publicBatch(cancelled!));
  });
}

function scopeField(scope: string | undefined): { scope?: string } {
  return scope === undefined ? {} : { scope };
}
