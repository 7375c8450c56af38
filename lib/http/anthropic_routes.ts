import type { Hono } from "hono";
import type { GenerationEvent, Usage } from "../core/generation.ts";
import { type ParsedToolCall, parseToolCalls, ToolCallStream } from "../chat/tool_calls.ts";
import { readJsonBody } from "./body.ts";
import { ApiError, fromGenerationError } from "./errors.ts";
import { anthropicError } from "./error_shapes.ts";
import { collectText, startGeneration, streamBody } from "./generation_run.ts";
import { parseAnthropic } from "./anthropic_request.ts";
import { AnthropicCountBody, AnthropicMessagesBody } from "./anthropic_schema.ts";
import { type OpenAiOptions, servedName } from "./openai_routes.ts";
import { newRequestId } from "./request_log.ts";
import { SSE_HEADERS, sseEvent } from "./sse.ts";
import type { GenerationDeps } from "./tracked_generation.ts";
import { parseWith } from "./validation.ts";

/**
 * Anthropic's Messages API: POST /v1/messages (one message object, or with `stream: true`
 * Anthropic's event sequence) and POST /v1/messages/count_tokens. The body maps onto the
 * OpenAI chat request (anthropic_request.ts) and runs through the same seam
 * (generation_run.ts); errors are Anthropic's `{"type": "error", "error": {...}}` (the app's
 * error mapping picks the shape by path). The key may come as `x-api-key` (auth_middleware.ts).
 */

type Done = Extract<GenerationEvent, { type: "done" }>;

/** A tool_use block's id: "toolu_" and 24 random letters and digits (Anthropic's look). */
function toolUseId(): string {
  const abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const bytes = crypto.getRandomValues(new Uint8Array(24));
  return "toolu_" + Array.from(bytes, (b) => abc[b % abc.length]).join("");
}

function toolUse(c: ParsedToolCall) {
  return { type: "tool_use", id: toolUseId(), name: c.name, input: JSON.parse(c.arguments) };
}

/**
 * Anthropic's usage: input_tokens are the prompt tokens not read from the prefix cache, which
 * are cache_read_input_tokens (the three add up to the prompt, as in Anthropic's accounting).
 */
function usage(u: Usage) {
  return {
    input_tokens: u.promptTokens - u.cachedTokens,
    cache_creation_input_tokens: 0,
    cache_read_input_tokens: u.cachedTokens,
    output_tokens: u.completionTokens,
  };
}

/** Why it ended, in Anthropic's words, and the client's stop sequence that ended it. */
function stopReason(ev: Done, calls: number, stops: readonly string[]) {
  if (ev.finishReason === "length") return { stop_reason: "max_tokens", stop_sequence: null };
  if (calls > 0) return { stop_reason: "tool_use", stop_sequence: null };
  // A template's own stop string (the plain chat format's) is the end of the turn.
  if (ev.stopString !== undefined && stops.includes(ev.stopString)) {
    return { stop_reason: "stop_sequence", stop_sequence: ev.stopString };
  }
  return { stop_reason: "end_turn", stop_sequence: null };
}

const SERVER_CUT =
  "The server shut down before this generation finished; retry on another instance";

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
  const stops = (b.stop_sequences ?? []) as string[];
  const message = {
    id,
    type: "message",
    role: "assistant",
    model: b.model,
  };
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
  const calls = parsed.toolFormat ? new ToolCallStream(parsed.toolFormat) : undefined;
  /** The open block: its index and whether it is text. */
  let block = -1;
  let textOpen = false;
  let callCount = 0;
  const closeText = (out: string[]) => {
    if (textOpen) {
      out.push(sseEvent("content_block_stop", { type: "content_block_stop", index: block }));
    }
    textOpen = false;
  };
  const pieces = (p: { content: string; calls: readonly ParsedToolCall[] }): string[] => {
    const out: string[] = [];
    if (p.content !== "") {
      if (!textOpen) {
        textOpen = true;
        out.push(sseEvent("content_block_start", {
          type: "content_block_start",
          index: ++block,
          content_block: { type: "text", text: "" },
        }));
      }
      out.push(sseEvent("content_block_delta", {
        type: "content_block_delta",
        index: block,
        delta: { type: "text_delta", text: p.content },
      }));
    }
    for (const c of p.calls) {
      closeText(out);
      const use = toolUse(c);
      const index = ++block;
      callCount++;
      out.push(
        sseEvent("content_block_start", {
          type: "content_block_start",
          index,
          content_block: { ...use, input: {} },
        }),
        sseEvent("content_block_delta", {
          type: "content_block_delta",
          index,
          delta: { type: "input_json_delta", partial_json: c.arguments },
        }),
        sseEvent("content_block_stop", { type: "content_block_stop", index }),
      );
    }
    return out;
  };
  const failed = (err: ApiError) => {
    deps.metrics.errors.inc({ code: err.code });
    return { chunks: [sseEvent("error", anthropicError(err))], last: true };
  };
  const render = (ev: GenerationEvent): { chunks: string[]; last: boolean } => {
    switch (ev.type) {
      case "started":
        return {
          chunks: [sseEvent("message_start", {
            type: "message_start",
            message: {
              ...message,
              content: [],
              stop_reason: null,
              stop_sequence: null,
              usage: usage({ promptTokens: ev.promptTokens, completionTokens: 0, cachedTokens: 0 }),
            },
          })],
          last: false,
        };
      case "token":
        return {
          chunks: pieces(calls ? calls.push(ev.text) : { content: ev.text, calls: [] }),
          last: false,
        };
      case "done": {
        if (ev.finishReason === "cancelled") return failed(new ApiError("draining", SERVER_CUT));
        const out = calls ? pieces(calls.finish(ev.finishReason === "length")) : [];
        closeText(out);
        out.push(
          sseEvent("message_delta", {
            type: "message_delta",
            delta: stopReason(ev, callCount, stops),
            usage: usage(ev.usage),
          }),
          sseEvent("message_stop", { type: "message_stop" }),
        );
        return { chunks: out, last: true };
      }
      case "error":
        return failed(fromGenerationError(ev.code, ev.message));
    }
  };
  return new Response(streamBody(run, deps, opts, render), { headers: SSE_HEADERS });
}
