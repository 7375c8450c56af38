import type { Hono } from "hono";
import { parseToolCalls } from "../chat/tool_calls.ts";
import { readJsonBody } from "./body.ts";
import { MessageEvents, type MessageHead, stopReason, toolUse, usage } from "./anthropic_format.ts";
import { collectText, startGeneration, streamBody } from "./generation_run.ts";
import { parseAnthropic } from "./anthropic_request.ts";
import { AnthropicCountBody, AnthropicMessagesBody } from "./anthropic_schema.ts";
import { type OpenAiOptions, servedName } from "./openai_routes.ts";
import { newRequestId } from "./request_log.ts";
import { SSE_HEADERS } from "./sse.ts";
import type { GenerationDeps } from "./tracked_generation.ts";
import { parseWith } from "./validation.ts";

/**
 * Anthropic's Messages API: POST /v1/messages (one message object, or with `stream: true`
 * Anthropic's event sequence) and POST /v1/messages/count_tokens. The body maps onto the
 * OpenAI chat request (anthropic_request.ts) and runs through the same seam
 * (generation_run.ts); errors are Anthropic's `{"type": "error", "error": {...}}` (the app's
 * error mapping picks the shape by path). The key may come as `x-api-key` (auth_middleware.ts).
 */

export function registerAnthropicRoutes(app: Hono, deps: GenerationDeps, opts: OpenAiOptions) {
  app.post("/v1/messages", (c) => messages(c.req.raw, deps, opts));
  app.post("/v1/messages/count_tokens", async (c) => {
    const b = parseWith(AnthropicCountBody, await readJsonBody(c.req.raw, opts.maxBodyBytes));
    const parsed = parseAnthropic(b, servedName(b.model, opts.servedModelNames), opts);
    const p = parsed.input.prompt;
    const n = typeof p === "string"
      ? deps.backend.countTokens(p, { special: parsed.input.specialTokens ?? false })
      : p.length;
    return c.json({ input_tokens: n });
  });
}

async function messages(req: Request, deps: GenerationDeps, opts: OpenAiOptions) {
  const b = parseWith(AnthropicMessagesBody, await readJsonBody(req, opts.maxBodyBytes));
  const parsed = parseAnthropic(b, servedName(b.model, opts.servedModelNames), opts);
  const id = "msg_" + newRequestId();
  const run = await startGeneration(req, parsed.input, deps, opts, "messages", id);
  // Checked by the OpenAI parser (as `stop`): a string or strings.
  const given = b.stop_sequences as string | string[] | undefined;
  const stops = typeof given === "string" ? [given] : given ?? [];
  const message: MessageHead = { id, type: "message", role: "assistant", model: b.model };
  if (b.stream !== true) {
    const { text, done } = await collectText(run, req.signal);
    const out = parsed.toolFormat === undefined
      ? { content: text, calls: [] }
      : parseToolCalls(text, parsed.toolFormat, done.finishReason === "length");
    const content = [
      ...(out.content ? [{ type: "text", text: out.content }] : []),
      ...out.calls.map(toolUse),
    ];
    return Response.json({
      ...message,
      content,
      ...stopReason(done, out.calls.length, stops),
      usage: usage(done.usage),
    });
  }
  const events = new MessageEvents(message, parsed.toolFormat, stops, deps.metrics);
  return new Response(streamBody(run, deps, opts, (ev) => events.render(ev)), {
    headers: SSE_HEADERS,
  });
}

/** POST /v1/messages's answer, for work the server runs itself (batch lines), under `scope`. */
export function messagesHandler(
  deps: GenerationDeps,
  opts: OpenAiOptions,
): (req: Request, scope?: string) => Promise<Response> {
  return (req, scope) =>
    messages(req, deps, scope === undefined ? opts : { ...opts, scopeOf: () => scope });
}
