import { type ApiError, errorTypeFor, type ErrorTypeNames, OPENAI_ERROR_TYPES } from "./errors.ts";

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
const ANTHROPIC_ERROR_TYPES: ErrorTypeNames = {
  byStatus: {
    ...OPENAI_ERROR_TYPES.byStatus,
    413: "request_too_large",
    503: "overloaded_error",
  },
  server: "api_error",
};

/** Anthropic's error object (also its streams' `error` event). */
export function anthropicError(
  e: ApiError,
): { type: "error"; error: { type: string; message: string } } {
  return {
    type: "error",
    error: { type: errorTypeFor(e.status, ANTHROPIC_ERROR_TYPES), message: e.message },
  };
}
