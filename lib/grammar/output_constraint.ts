/**
 * What a request asks its output to be, as plain data: it travels in the result cache's key and
 * in the router's messages, and the serving core compiles it (grammar_service.ts).
 */
export type OutputConstraint =
  /** Any JSON object (OpenAI's `response_format: {type: "json_object"}`). */
  | { readonly type: "json_object" }
  /** JSON valid under a JSON Schema, given as its JSON text (keys as the client sent them). */
  | { readonly type: "json_schema"; readonly schema: string }
  /** A GBNF grammar (llama-server's `grammar`), root rule `root`. */
  | { readonly type: "grammar"; readonly grammar: string }
  /**
   * Either JSON valid under the schema, or free text whose first non-blank character is not
   * "{": the model chooses between a tool call and an answer (tool_choice "auto" on a model
   * without tool syntax), and whatever starts like JSON must be the valid call.
   */
  | { readonly type: "json_schema_or_text"; readonly schema: string };

/** A stable text for the constraint: what the compile cache and the result cache key on. */
export function constraintKey(c: OutputConstraint): string {
  switch (c.type) {
    case "json_object":
      return "json_object";
    case "json_schema":
      return `json_schema:${c.schema}`;
    case "grammar":
      return `grammar:${c.grammar}`;
    case "json_schema_or_text":
      return `json_schema_or_text:${c.schema}`;
  }
}
