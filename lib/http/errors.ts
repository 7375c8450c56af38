import type { GenerationErrorCode } from "../core/generation.ts";
import { ChatRequestError } from "../chat/chat_error.ts";

/** Every error code a client can receive, over HTTP (`error.code`) or the WebSocket (`code`). */
export type ApiErrorCode =
  | "invalid_json"
  | "invalid_request"
  | "unknown_type"
  | "unsupported_frame"
  | "duplicate_id"
  | "unknown_id"
  | "too_many_generations"
  | "too_many_connections"
  | "frame_too_large"
  | "payload_too_large"
  | "unauthorized"
  | "forbidden_origin"
  | "forbidden_host"
  | "not_found"
  | "method_not_allowed"
  | "unsupported_media_type"
  | "upgrade_required"
  | "model_not_found"
  | "context_length_exceeded"
  | "too_many_batches"
  | "too_many_uploads"
  | "storage_quota_exceeded"
  | "insufficient_storage"
  | "conflict"
  | "overloaded"
  | "draining"
  | "loading"
  | "model_load_failed"
  | "insufficient_memory"
  | "not_implemented"
  | "internal";

const STATUS: Record<ApiErrorCode, number> = {
  invalid_json: 400,
  invalid_request: 400,
  unknown_type: 400,
  unsupported_frame: 400,
  duplicate_id: 409,
  unknown_id: 404,
  too_many_generations: 429,
  too_many_connections: 429,
  frame_too_large: 413,
  payload_too_large: 413,
  unauthorized: 401,
  forbidden_origin: 403,
  forbidden_host: 403,
  not_found: 404,
  method_not_allowed: 405,
  unsupported_media_type: 415,
  upgrade_required: 426,
  model_not_found: 404,
  context_length_exceeded: 400,
  too_many_batches: 429,
  too_many_uploads: 429,
  storage_quota_exceeded: 400,
  insufficient_storage: 507,
  conflict: 409,
  overloaded: 503,
  draining: 503,
  loading: 503,
  // The server cannot serve that model as configured (a cache that cannot hold it, a broken
  // file): not the client's fault, and no crash; waiting does not help (no Retry-After).
  model_load_failed: 503,
  insufficient_memory: 503,
  internal: 500,
  // A route of another API's spelling that this server does not implement (yet).
  not_implemented: 501,
};

/** An API's names for its error types: by status, and for any other 5xx. */
export interface ErrorTypeNames {
  readonly byStatus: Readonly<Record<number, string>>;
  readonly server: string;
}

/** The OpenAI-style `error.type` names (which Anthropic's share for the client's faults). */
export const OPENAI_ERROR_TYPES: ErrorTypeNames = {
  byStatus: {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
  },
  server: "server_error",
};

/** The `error.type` of a status in an API's names; any other 4xx is an invalid request. */
export function errorTypeFor(status: number, names: ErrorTypeNames): string {
  return names.byStatus[status] ?? (status >= 500 ? names.server : "invalid_request_error");
}

/** The HTTP status of an error code; undefined for a code that is not an API error's. */
export function statusOfCode(code: string): number | undefined {
  return Object.hasOwn(STATUS, code) ? STATUS[code as ApiErrorCode] : undefined;
}

/** A client-visible failure: its code decides the HTTP status; param names the offending field. */
export class ApiError extends Error {
  readonly status: number;
  readonly type: string;

  constructor(
    readonly code: ApiErrorCode,
    message: string,
    readonly param: string | null = null,
  ) {
    super(message);
    this.name = "ApiError";
    this.status = STATUS[code];
    this.type = errorTypeFor(this.status, OPENAI_ERROR_TYPES);
  }

  /** The OpenAI error envelope. */
  toJSON(): { error: { message: string; type: string; param: string | null; code: string } } {
    return {
      error: { message: this.message, type: this.type, param: this.param, code: this.code },
    };
  }
}

/** Converts a core error event into the client-facing error (same code, same message). */
export function fromGenerationError(code: GenerationErrorCode, message: string): ApiError {
  return new ApiError(code, message);
}

/** Anything thrown inside a handler, as an ApiError (unknown failures become "internal"). */
export function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  if (err instanceof ChatRequestError) {
    return new ApiError("invalid_request", err.message, err.param);
  }
  const detail = err instanceof Error ? err.message : String(err);
  return new ApiError("internal", `Internal error: ${detail}`);
}

/** Short, JSON-ish rendering of a received value for error messages. */
export function preview(value: unknown, max = 60): string {
  let text: string;
  try {
    text = value === undefined ? "undefined" : JSON.stringify(value) ?? String(value);
  } catch {
    text = String(value);
  }
  return text.length > max ? text.slice(0, max) + "…" : text;
}
