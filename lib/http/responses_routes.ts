import type { Hono } from "hono";
import { parseToolCalls } from "../chat/tool_calls.ts";
import { readJsonBody } from "./body.ts";
import { collectText, startGeneration, streamBody } from "./generation_run.ts";
import { type OpenAiOptions, type Parsed, servedName } from "./openai_routes.ts";
import { newRequestId } from "./request_log.ts";
import {
  outputItems,
  ResponseEvents,
  type ResponseHead,
  responseObject,
} from "./responses_format.ts";
import { parseResponses } from "./responses_request.ts";
import { ResponsesBody } from "./responses_schema.ts";
import { SSE_HEADERS } from "./sse.ts";
import type { GenerationDeps } from "./tracked_generation.ts";
import { parseWith } from "./validation.ts";

/**
 * OpenAI's Responses API, stateless: POST /v1/responses answers a response object, or with
 * `stream: true` the `response.*` events. Nothing is stored (`store` defaults to false here;
 * true, `previous_response_id` and `background` are refused by the schema). The body maps onto
 * the chat request (responses_request.ts) and runs through the same seam (generation_run.ts);
 * errors are OpenAI's envelope, named with the Responses fields.
 */

export function registerResponsesRoutes(app: Hono, deps: GenerationDeps, opts: OpenAiOptions) {
  app.post("/v1/responses", (c) => responses(c.req.raw, deps, opts));
}

/** The fields of the response that echo the request (OpenAI's response object). */
function head(id: string, b: ResponsesBody, parsed: Parsed): ResponseHead {
  const input = parsed.input;
  return {
    id,
    object: "response",
    created_at: Math.floor(Date.now() / 1000),
    model: parsed.model,
    error: null,
    instructions: b.instructions ?? null,
    max_output_tokens: input.maxTokens ?? null,
    temperature: input.temperature ?? null,
    top_p: input.topP ?? null,
    tools: (b.tools ?? []).map((t) => ({
      ...t,
      description: t.description ?? null,
      parameters: t.parameters ?? null,
      strict: t.strict ?? null,
    })),
    tool_choice: b.tool_choice ?? "auto",
    parallel_tool_calls: b.parallel_tool_calls ?? true,
    text: { format: b.text?.format ?? { type: "text" } },
    truncation: "disabled",
    store: false,
    background: false,
    previous_response_id: null,
    metadata: b.metadata ?? {},
    ...(b.user ? { user: b.user } : {}),
  };
}

async function responses(req: Request, deps: GenerationDeps, opts: OpenAiOptions) {
  const b = parseWith(ResponsesBody, await readJsonBody(req, opts.maxBodyBytes));
  const parsed = parseResponses(b, servedName(b.model, opts.servedModelNames), opts);
  const id = "resp_" + newRequestId();
  const run = await startGeneration(req, parsed.input, deps, opts, "responses", id);
  const response = head(id, b, parsed);
  if (b.stream !== true) {
    const { text, done } = await collectText(run, req.signal);
    const out = parsed.toolFormat === undefined
      ? { content: text, calls: [] }
      : parseToolCalls(text, parsed.toolFormat, done.finishReason === "length");
    return Response.json(responseObject(response, outputItems(out.content ?? "", out.calls), done));
  }
  const events = new ResponseEvents(response, parsed.toolFormat, deps.metrics);
  return new Response(streamBody(run, deps, opts, (ev) => events.render(ev)), {
    headers: SSE_HEADERS,
  });
}
