/**
 * A chat request the templates or the tool definitions cannot take: the messages, `tools` or
 * `tool_choice` are malformed. lib/chat speaks no HTTP, so it raises this and lib/http's
 * `toApiError` answers it as a 400 `invalid_request` naming `param`.
 */
export class ChatRequestError extends Error {
  constructor(message: string, readonly param: string | null = null) {
    super(message);
    this.name = "ChatRequestError";
  }
}
