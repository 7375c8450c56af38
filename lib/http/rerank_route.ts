import type { Hono } from "hono";
import { z } from "zod";
import type { GenerationBackend, GenerationRequest, Priority } from "../core/generation.ts";
import { GREEDY } from "../engine/engine.ts";
import { readJsonBody } from "./body.ts";
import { ApiError, fromGenerationError } from "./errors.ts";
import { servedName } from "./openai_routes.ts";
import { parseWith } from "./validation.ts";
import { PARAM_FIELDS } from "./request_params.ts";
import type { EmbeddingsOptions } from "./embeddings_route.ts";
import {
  DEFAULT_RERANK_INSTRUCTION,
  fillRerankPrompt,
  INSTRUCTION_PLACE,
  QWEN3_RERANK_PROMPT,
} from "../core/rerank_prompt.ts";

/** The most documents one request may rank. */
export const MAX_RERANK_DOCUMENTS = 1024;

/** POST /v1/rerank (llama-server's and vLLM's shape). */
export const RerankBody = z.strictObject({
  model: z.string().nullish(),
  query: z.string().min(1),
  documents: z.array(z.string()).min(1).max(MAX_RERANK_DOCUMENTS),
  top_n: z.number().int().positive().nullish(),
  /**
   * Ours: the reranker's instruction, for a prompt with an {instruction} place (Qwen3-Reranker's
   * default otherwise).
   */
  instruction: z.string().nullish(),
  return_documents: z.boolean().nullish(),
  priority: PARAM_FIELDS.priority.nullish(),
});

/**
 * POST /v1/rerank: each document scored as a decoder reranker is (Qwen3-Reranker): the
 * probability that the model answers "yes" rather than "no" after the prompt (the backend's,
 * lib/core/rerank_prompt.ts says whence; Qwen3-Reranker's without one). Both answers get
 * the same large logit bias, so they are the two most likely tokens whatever the model, and
 * their probabilities' ratio is the ratio of exp(logit) the reranker defines. Results are in
 * order of score, the best first, `top_n` of them.
 */
export function registerRerankRoute(app: Hono, o: EmbeddingsOptions): void {
  app.post("/v1/rerank", async (c) => {
    const b = parseWith(RerankBody, await readJsonBody(c.req.raw, o.maxBodyBytes));
    const model = servedName(b.model, o.servedModelNames);
    const [yes, no] = ["yes", "no"].map((w) => answerToken(o.backend, w));
    const template = o.backend.rerankPrompt ?? QWEN3_RERANK_PROMPT;
    if (b.instruction != null && !template.includes(INSTRUCTION_PLACE)) {
      throw new ApiError(
        "invalid_request",
        `'instruction' is given, but this model's rerank prompt has no ${INSTRUCTION_PLACE} place for it (its prompt comes from --rerank-prompt or the file's tokenizer.chat_template.rerank)`,
        "instruction",
      );
    }
    const instruction = b.instruction ?? DEFAULT_RERANK_INSTRUCTION;
    // The prompt is read with its special tokens: client text must not spell one.
    const texts: [string, string][] = [
      ["query", b.query],
      ["instruction", instruction],
      ...b.documents.map((d, i): [string, string] => [`documents[${i}]`, d]),
    ];
    for (const [param, text] of texts) {
      const spelled = o.backend.specialTokens.find((t) => t.length > 0 && text.includes(t));
      if (spelled !== undefined) {
        throw new ApiError(
          "invalid_request",
          `${param} spells the special token ${
            JSON.stringify(spelled)
          }, which only the rerank prompt may hold`,
          param,
        );
      }
    }
    let promptTokens = 0;
    const scores = await Promise.all(b.documents.map(async (document, index) => {
      const text = fillRerankPrompt(template, { query: b.query, document, instruction });
      // As llama-server tokenizes a rerank template: its special tokens read, none added.
      const ids = o.backend.tokenize(text, { bos: false, special: true });
      if (ids.length >= o.backend.contextLength) {
        throw new ApiError(
          "context_length_exceeded",
          `documents[${index}] makes a prompt of ${ids.length} tokens with the query; the model's context is ${o.backend.contextLength}`,
          `documents[${index}]`,
        );
      }
      promptTokens += ids.length;
      const score = await yesProbability(
        o.backend,
        ids,
        yes!,
        no!,
        b.priority ?? "interactive",
        c.req.raw.signal,
      );
      return {
        index,
        relevance_score: score,
        ...(b.return_documents ? { document: { text: document } } : {}),
      };
    }));
    scores.sort((x, y) => y.relevance_score - x.relevance_score || x.index - y.index);
    return c.json({
      object: "list",
      model,
      results: scores.slice(0, b.top_n ?? scores.length),
      usage: { prompt_tokens: promptTokens, total_tokens: promptTokens },
    });
  });
}

/** The one token a reranker answers `word` with; a 400 where the vocabulary spells it otherwise. */
function answerToken(backend: GenerationBackend, word: string): number {
  const ids = backend.tokenize(word, { bos: false, special: false });
  if (ids.length !== 1) {
    throw new ApiError(
      "invalid_request",
      `This model cannot rerank: its vocabulary spells "${word}" in ${ids.length} tokens, a reranker answers it in one`,
      "model",
    );
  }
  return ids[0]!;
}

/** P(yes) / (P(yes) + P(no)) at the position after `ids`. */
async function yesProbability(
  backend: GenerationBackend,
  ids: readonly number[],
  yes: number,
  no: number,
  priority: Priority,
  signal: AbortSignal,
): Promise<number> {
  const req: GenerationRequest = {
    prompt: ids,
    maxTokens: 1,
    sampling: GREEDY,
    stop: [],
    ignoreEos: true,
    controls: { logitBias: [[yes, 100], [no, 100]] },
    priority,
    requestId: crypto.randomUUID(),
    logprobs: true,
    topLogprobs: 2,
  };
  for await (const ev of backend.generate(req, signal)) {
    if (ev.type === "error") throw fromGenerationError(ev.code, ev.message);
    if (ev.type !== "token" || ev.top === undefined) continue;
    const lp = (id: number) => {
      const k = ev.top!.ids.indexOf(id);
      return k < 0 ? -Infinity : ev.top!.logprobs[k]!;
    };
    const [y, n] = [lp(yes), lp(no)];
    const m = Math.max(y, n);
    return Math.exp(y - m) / (Math.exp(y - m) + Math.exp(n - m));
  }
  throw new ApiError("internal", "Reranking failed: the model gave no token");
}
