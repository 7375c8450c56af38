/**
 * The objects of the batch queue, in the shapes of OpenAI's Files and Batch APIs (what the
 * official clients parse), and the records the store keeps for them.
 */

/** The endpoints a batch may run (OpenAI's names). */
export const BATCH_ENDPOINTS = [
  "/v1/chat/completions",
  "/v1/completions",
  "/v1/embeddings",
  "/v1/messages",
] as const;
export type BatchEndpoint = typeof BATCH_ENDPOINTS[number];

export type BatchStatus =
  | "validating"
  | "in_progress"
  | "finalizing"
  | "completed"
  | "cancelling"
  | "cancelled"
  | "failed"
  | "expired";

/** Statuses a batch never leaves. */
export const TERMINAL_STATUSES: ReadonlySet<BatchStatus> = new Set([
  "completed",
  "cancelled",
  "failed",
  "expired",
]);

export type FilePurpose = "batch" | "batch_output";

/** OpenAI's file object. */
export interface FileObject {
  readonly id: string;
  readonly object: "file";
  readonly bytes: number;
  readonly created_at: number;
  readonly filename: string;
  readonly purpose: FilePurpose;
  readonly status: "processed";
  /** Input files: how many request lines it holds (an extension, counted at upload). */
  readonly lines?: number;
  /** Not sent to clients: the cache scope of the API key it belongs to (see BatchObject). */
  readonly scope?: string;
  /**
   * Not sent to clients: an output (ok) or error file's content is the records of this batch's
   * results log, of its first `lines` lines, sorted by line; the log is its one copy.
   */
  readonly results?: { readonly batch: string; readonly ok: boolean; readonly lines: number };
}

export interface RequestCounts {
  total: number;
  completed: number;
  failed: number;
}

/** A problem that failed a whole batch at validation (OpenAI's `errors.data[]`). */
export interface BatchValidationError {
  readonly code: string;
  readonly message: string;
  readonly param: string | null;
  /** 1-based line of the input file. */
  readonly line: number | null;
}

/** OpenAI's batch object. Times are Unix seconds, null until the status is reached. */
export interface BatchObject {
  id: string;
  object: "batch";
  endpoint: BatchEndpoint;
  errors: { object: "list"; data: BatchValidationError[] } | null;
  input_file_id: string;
  completion_window: "24h";
  status: BatchStatus;
  output_file_id: string | null;
  error_file_id: string | null;
  created_at: number;
  in_progress_at: number | null;
  expires_at: number;
  finalizing_at: number | null;
  completed_at: number | null;
  failed_at: number | null;
  expired_at: number | null;
  cancelling_at: number | null;
  cancelled_at: number | null;
  request_counts: RequestCounts;
  metadata: Record<string, string> | null;
  /**
   * Not sent to clients: the cache scope of the API key that created it. Its lines share
   * cached work as that key's own requests would, and other keys do not see it.
   */
  scope?: string;
}

/** One request line of an input file, after the file passed validation. */
export interface BatchLine {
  /** 0-based position in the input file. */
  readonly index: number;
  readonly customId: string;
  readonly body: Record<string, unknown>;
}

/** One line of an output or error file (OpenAI's batch output shape). */
export interface OutputLine {
  readonly id: string;
  readonly custom_id: string;
  readonly response: {
    readonly status_code: number;
    readonly request_id: string;
    readonly body: unknown;
  } | null;
  readonly error: { readonly code: string; readonly message: string } | null;
}

/**
 * What the results log holds for one finished line: its index, whether it goes to the output
 * file (a 2xx answer) or the error file, and the line itself.
 */
export interface ResultRecord {
  readonly index: number;
  readonly ok: boolean;
  readonly line: OutputLine;
}

/** The batch object as clients see it (without the private fields). */
export function publicBatch(b: BatchObject): Omit<BatchObject, "scope"> {
  const { scope: _scope, ...rest } = b;
  return { ...rest, request_counts: { ...rest.request_counts } };
}

export function publicFile(f: FileObject): Omit<FileObject, "scope" | "results"> {
  const { scope: _scope, results: _results, ...rest } = f;
  return rest;
}

/**
 * Whether a request may see an object: with --cache-scope key and API keys on, only the key
 * that made it does; objects made without a key, and requests without a scope, see all.
 */
export function visibleTo(owner: string | undefined, asker: string | undefined): boolean {
  return owner === undefined || asker === undefined || owner === asker;
}
