/**
 * The prompt a decoder reranker is asked in, and how its places are filled. Where it comes
 * from, first that is given: `--rerank-prompt`, the GGUF's `tokenizer.chat_template.rerank`
 * (what llama-server reads), else Qwen3-Reranker's own. `{query}` and `{document}` are
 * replaced as llama-server replaces them; `{instruction}`, where the prompt has one, with the
 * request's instruction (Qwen3-Reranker's default otherwise).
 */

/**
 * Qwen3-Reranker's prompt: a system line, then the instruction, query and document, then the
 * assistant's empty thinking; the score is the probability of "yes" against "no" next.
 */
export const QWEN3_RERANK_PROMPT = "<|im_start|>system\nJudge whether the Document meets the " +
  'requirements based on the Query and the Instruct provided. Note that the answer can only be "yes" or "no".' +
  "<|im_end|>\n<|im_start|>user\n<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}" +
  "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

/** Qwen3-Reranker's default instruction. */
export const DEFAULT_RERANK_INSTRUCTION =
  "Given a web search query, retrieve relevant passages that answer the query";

/** The places a rerank prompt must have. */
export const RERANK_PLACES = ["{query}", "{document}"] as const;
/** The place a prompt may have for the request's instruction. */
export const INSTRUCTION_PLACE = "{instruction}";

/**
 * What is wrong with a rerank prompt given by hand, or undefined.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * assertEquals(rerankPromptProblem("Q: {query}\nD: {document}\nRelevant:"), undefined);
 * assertEquals(rerankPromptProblem("Q: {query}"), "it has no {document} place");
 * ```
 */
export function rerankPromptProblem(template: string): string | undefined {
  const missing = RERANK_PLACES.filter((p) => !template.includes(p));
  return missing.length === 0 ? undefined : `it has no ${missing.join(" or ")} place`;
}

/**
 * The prompt for one document: every place replaced in one pass, so text a client gives is
 * never read as a place (a query spelling "{document}" stays as it is).
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * assertEquals(
 *   fillRerankPrompt("[{query}|{document}]", { query: "{document}", document: "d", instruction: "i" }),
 *   "[{document}|d]",
 * );
 * ```
 */
export function fillRerankPrompt(
  template: string,
  fields: { query: string; document: string; instruction: string },
): string {
  return template.replace(
    /\{(query|document|instruction)\}/g,
    (_, k: keyof typeof fields) => fields[k],
  );
}
