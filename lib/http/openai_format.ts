import type { CacheHit, FinishReason, Timings, Usage } from "../core/generation.ts";
import { round, timingsJson } from "./protocol.ts";

/**
 * Our extensions on a final response or chunk: whether max_tokens was lowered to fit the
 * context, and whether the answer came from the result cache (with the time it saved).
 */
export interface ResponseExtras {
  max_tokens_capped: boolean;
  cached: boolean;
  saved_ms?: number;
  /** An answer of a similar question: which, and how close (the cache for similar questions). */
  llmserve?: { cache: { kind: "similar"; score: number; matched: string } };
}

export function responseExtras(capped: boolean, cached: CacheHit | undefined): ResponseExtras {
  const similar = cached?.similar;
  return {
    max_tokens_capped: capped,
    cached: cached !== undefined,
    ...(cached !== undefined ? { saved_ms: round(cached.savedMs) } : {}),
    ...(similar
      ? {
        llmserve: {
          cache: {
            kind: "similar",
            score: Math.round(similar.score * 1e4) / 1e4,
            matched: similar.matched,
          },
        },
      }
      : {}),
  };
}

/** Response objects of the OpenAI API, as the official clients parse them. */

export interface OpenAiUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

export function openAiUsage(u: Usage): OpenAiUsage {
  return {
    prompt_tokens: u.promptTokens,
    completion_tokens: u.completionTokens,
    total_tokens: u.promptTokens + u.completionTokens,
    prompt_tokens_details: { cached_tokens: u.cachedTokens },
  };
}

/** One sampled token, as logprobs need it. */
export interface TokenLogprob {
  readonly text: string;
  readonly logprob: number;
  /** The most likely tokens at its position (top_logprobs / completions' logprobs > 0). */
  readonly top?: readonly { readonly text: string; readonly logprob: number }[];
}

const utf8 = (s: string) => [...new TextEncoder().encode(s)];

/** Identity of one response: every chunk of a stream repeats it. */
export interface ResponseMeta {
  readonly id: string;
  readonly created: number;
  readonly model: string;
}

function chatLogprobs(tokens: readonly TokenLogprob[]) {
  return {
    content: tokens.map((t) => ({
      token: t.text,
      logprob: t.logprob,
      bytes: utf8(t.text),
      top_logprobs: (t.top ?? []).map((a) => ({
        token: a.text,
        logprob: a.logprob,
        bytes: utf8(a.text),
      })),
    })),
  };
}

function completionLogprobs(tokens: readonly TokenLogprob[], offset: number) {
  const text_offset: number[] = [];
  let at = offset;
  for (const t of tokens) {
    text_offset.push(at);
    at += t.text.length;
  }
  return {
    tokens: tokens.map((t) => t.text),
    token_logprobs: tokens.map((t) => t.logprob),
    // vLLM's shape: the alternatives, and the sampled token (so up to n + 1 entries).
    top_logprobs: tokens.map((t) => {
      if (t.top === undefined) return {};
      const out: Record<string, number> = {};
      for (const a of [...t.top, t]) if (!(a.text in out)) out[a.text] = a.logprob;
      return out;
    }),
    text_offset,
  };
}

/** A chat answer's finish reasons: the core's, and "tool_calls" when the answer is calls. */
export type ChatFinishReason = FinishReason | "tool_calls";

/** A call in a chat answer, as OpenAI writes it. */
export interface OpenAiToolCall {
  readonly id: string;
  readonly type: "function";
  readonly function: { readonly name: string; readonly arguments: string };
}

/** What one choice of a finished response holds. */
export interface ChoiceResult {
  /** The text; for a chat answer of calls, the content beside them (null when none). */
  readonly text: string | null;
  readonly finish: ChatFinishReason;
  readonly logprobs: readonly TokenLogprob[] | null;
  /** Chat: the calls parsed from the answer (tools.ts), when there are any. */
  readonly toolCalls?: readonly OpenAiToolCall[];
}

/** A streamed call's delta: its id, type and name first, then its arguments. */
export interface ToolCallDelta {
  readonly index: number;
  readonly id?: string;
  readonly type?: "function";
  readonly function: { readonly name?: string; readonly arguments: string };
}

/** What every OpenAI response object and chunk opens with, `object` naming its kind. */
function objectHead(meta: ResponseMeta, object: string) {
  return { id: meta.id, object, created: meta.created, model: meta.model };
}

/** Each kind of whole response's fields of one choice, beside its index. */
const CHOICE_FIELDS = {
  "text_completion": (c: ChoiceResult) => ({
    text: c.text ?? "",
    finish_reason: c.finish,
    logprobs: c.logprobs === null ? null : completionLogprobs(c.logprobs, 0),
  }),
  "chat.completion": (c: ChoiceResult) => ({
    message: {
      role: "assistant",
      content: c.text,
      refusal: null,
      ...(c.toolCalls && c.toolCalls.length > 0 ? { tool_calls: c.toolCalls } : {}),
    },
    finish_reason: c.finish,
    logprobs: c.logprobs === null ? null : chatLogprobs(c.logprobs),
  }),
};

/** A whole (non-streamed) response: every choice, then the usage and the timings. */
export function wholeResponse(
  object: keyof typeof CHOICE_FIELDS,
  meta: ResponseMeta,
  choices: readonly ChoiceResult[],
  usage: Usage,
  timings: Timings,
  extras: ResponseExtras,
) {
  return {
    ...objectHead(meta, object),
    choices: choices.map((c, index) => ({ index, ...CHOICE_FIELDS[object](c) })),
    usage: openAiUsage(usage),
    timings: timingsJson(timings),
    ...extras,
  };
}

/** A streamed chunk of one choice (`usage: null` where include_usage promised a last one). */
function chunk<C>(
  meta: ResponseMeta,
  object: string,
  choice: C,
  withUsageField: boolean,
  extras?: ResponseExtras,
) {
  return {
    ...objectHead(meta, object),
    choices: [choice],
    ...(withUsageField ? { usage: null } : {}),
    ...extras,
  };
}

export function completionChunk(
  meta: ResponseMeta,
  text: string,
  finish: FinishReason | null,
  logprobs: { tokens: readonly TokenLogprob[]; offset: number } | null,
  withUsageField: boolean,
  extras?: ResponseExtras,
  index = 0,
) {
  return chunk(
    meta,
    "text_completion",
    {
      index,
      text,
      finish_reason: finish,
      logprobs: logprobs === null ? null : completionLogprobs(logprobs.tokens, logprobs.offset),
    },
    withUsageField,
    extras,
  );
}

export function chatChunk(
  meta: ResponseMeta,
  delta: { role?: "assistant"; content?: string; tool_calls?: readonly ToolCallDelta[] },
  finish: ChatFinishReason | null,
  logprobs: readonly TokenLogprob[] | null,
  withUsageField: boolean,
  extras?: ResponseExtras,
  index = 0,
) {
  return chunk(
    meta,
    "chat.completion.chunk",
    {
      index,
      delta,
      finish_reason: finish,
      logprobs: logprobs === null ? null : chatLogprobs(logprobs),
    },
    withUsageField,
    extras,
  );
}

/** The extra last chunk sent when stream_options.include_usage is set (no choices). */
export function usageChunk(meta: ResponseMeta, object: string, usage: Usage) {
  return {
    ...objectHead(meta, object),
    choices: [],
    usage: openAiUsage(usage),
  };
}
