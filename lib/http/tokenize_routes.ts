import { outsideVocabulary, vocabularyProblem } from "../core/prompt_check.ts";
import type { Hono } from "hono";
import type { GenerationBackend } from "../core/generation.ts";
import { readJsonBody } from "./body.ts";
import type { ChatRenderer } from "../chat/chat_template.ts";
import { ApiError } from "./errors.ts";
import { servedName } from "./openai_routes.ts";
import { DetokenizeBody, TokenizeBody } from "./schemas.ts";
import { parseWith } from "./validation.ts";
import { chatTurns, type TemplateTools } from "../chat/tools.ts";

export interface TokenizeOptions {
  readonly backend: GenerationBackend;
  readonly renderChat: ChatRenderer;
  /** What the model's template does with tools (tool messages need its support). */
  readonly templateTools: TemplateTools;
  readonly maxBodyBytes: number;
  readonly servedModelNames: readonly string[];
}

/**
 * POST /tokenize and POST /detokenize, answering llama-server's and vLLM's request shapes at
 * the same paths (both servers use them). Which shape a request has is told by its text field:
 *
 * - `content` (llama-server): BOS only with `add_special: true`; control-token text is plain
 *   characters unless `parse_special: true` (the way /v1/completions reads a prompt, where
 *   llama-server's default is true); `with_pieces: true` gives `[{id, piece}]`.
 * - `prompt` (vLLM): BOS unless `add_special_tokens: false`.
 * - `messages` (vLLM): the ids a chat completion of those messages runs on (the model's
 *   template decides the special tokens, so `add_special_tokens` changes nothing).
 *
 * The answer carries both servers' fields: `{tokens, count, max_model_len}`. /detokenize
 * answers `{content, prompt}` (llama-server reads `content`, vLLM `prompt`; the same text).
 */
export function registerTokenizeRoutes(app: Hono, o: TokenizeOptions): void {
  app.post("/tokenize", async (c) => {
    const b = parseWith(TokenizeBody, await readJsonBody(c.req.raw, o.maxBodyBytes));
    if (b.model !== undefined && b.model !== null) servedName(b.model, o.servedModelNames);
    const given = (["content", "prompt", "messages"] as const).filter((k) => b[k] !== undefined);
    if (given.length !== 1) {
      throw new ApiError(
        "invalid_request",
        given.length === 0
          ? "Give the text to tokenize as 'content' (llama-server), 'prompt' or 'messages' (vLLM)"
          : `Give exactly one of 'content', 'prompt' and 'messages'; received ${
            given.map((k) => `'${k}'`).join(" and ")
          }`,
        given[1] ?? "content",
      );
    }
    // Tokenizing runs on the thread that streams every generation: a 760 KB text stalled all
    // streams for 765 ms. Like a prompt, text that cannot fit in the context is refused from
    // a cheap lower bound on its tokens, before it is tokenized.
    const fits = (text: string, param: string) => {
      const atLeast = o.backend.minTokens?.(text) ?? 0;
      if (atLeast <= o.backend.contextLength) return;
      throw new ApiError(
        "context_length_exceeded",
        `The text is at least ${atLeast} tokens (${text.length} characters) but the model's ` +
          `context is ${o.backend.contextLength} tokens; /tokenize takes at most that much`,
        param,
      );
    };
    let ids: number[];
    if (b.messages !== undefined) {
      if (b.add_generation_prompt === false) {
        throw new ApiError(
          "invalid_request",
          "add_generation_prompt: false is not supported: chat prompts always end with the " +
            "assistant's turn, as /v1/chat/completions renders them",
          "add_generation_prompt",
        );
      }
      const chat = o.renderChat(chatTurns(b.messages, o.templateTools), b.chat_template_kwargs);
      fits(chat.prompt, "messages");
      ids = o.backend.tokenize(chat.prompt, { bos: true, special: chat.special });
    } else if (b.content !== undefined) {
      fits(b.content, "content");
      ids = o.backend.tokenize(b.content, {
        bos: b.add_special === true,
        special: b.parse_special === true,
      });
    } else {
      fits(b.prompt!, "prompt");
      ids = o.backend.tokenize(b.prompt!, { bos: b.add_special_tokens ?? true, special: false });
    }
    const tokens = b.with_pieces === true
      ? ids.map((id) => ({ id, piece: piece(o.backend, id) }))
      : ids;
    return c.json({ tokens, count: ids.length, max_model_len: o.backend.contextLength });
  });

  app.post("/detokenize", async (c) => {
    const b = parseWith(DetokenizeBody, await readJsonBody(c.req.raw, o.maxBodyBytes));
    if (b.model !== undefined && b.model !== null) servedName(b.model, o.servedModelNames);
    const problem = vocabularyProblem(b.tokens, o.backend.vocabSize);
    if (problem !== undefined) {
      const at = outsideVocabulary(b.tokens, o.backend.vocabSize!);
      throw new ApiError("invalid_request", `Invalid 'tokens': ${problem}`, `tokens[${at}]`);
    }
    const text = o.backend.detokenize(b.tokens);
    return c.json({ content: text, prompt: text });
  });
}

/** A token's text on its own, or its vocabulary spelling when that is not text (BOS, a lone byte). */
function piece(backend: GenerationBackend, id: number): string {
  const text = backend.detokenize([id]);
  return text === "" || text.includes("\uFFFD") ? backend.tokenPiece(id) : text;
}
