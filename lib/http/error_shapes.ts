import type { ApiError } from "./errors.ts";

/**
 * The error body each API's clients read, chosen by path: Ollama's clients read a string
 * `error` (`{"error": "..."}`), Anthropic's `{"type": "error", "error": {"type", "message"}}`,
 * everything else OpenAI's envelope. The status and headers are the same whichever shape.
 */
export function errorBody(e: ApiError, path: string): unknown {
  if (path.startsWith("/api/")) return ollamaError(e);
  if (path === "/v1/messages" || path.startsWith("/v1/messages/")) return anthropicError(e);
  return e.toJSON();
}

/** Ollama's error object. */
export function ollamaError(e: ApiError): { error: string } {
  return { error: e.message };
}

/** Anthropic's error types by HTTP status (its errors page). */
function anthropicType(status: number): string {
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 404) return "not_found_error";
  if (status === 413) return "request_too_large";
  if (status === 429) return "rate_limit_error";
  if (status === 503) return "overloaded_error";
  if (status >= 500) return "api_error";
  return "invalid_request_error";
}

/** Anthropic's error object (also its streams' `error` event). */
export function anthropicError(
  e: ApiError,
): { type: "error"; error: { type: string; message: string } } {
  return { type: "error", error: { type: anthropicType(e.status), message: e.message } };
}
