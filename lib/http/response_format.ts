import { z } from "zod";
import type { OutputConstraint } from "../grammar/output_constraint.ts";
import { unsupportedSchemaPart } from "../grammar/schema_support.ts";
import { ApiError } from "./errors.ts";

/**
 * The request fields that constrain the output, in each server's spelling: OpenAI's
 * `response_format` (json_object, json_schema), llama-server's `json_schema` and `grammar`
 * (GBNF), vLLM's `guided_json` and `guided_grammar`. At most one may be given.
 */

/** A JSON Schema, as every API spells it in a request: an object. */
export const jsonSchemaObject = z.record(z.string(), z.unknown(), {
  error: "expected a JSON Schema object",
});

export const ResponseFormat = z.discriminatedUnion("type", [
  z.strictObject({ type: z.literal("text") }),
  z.strictObject({ type: z.literal("json_object") }),
  z.strictObject({
    type: z.literal("json_schema"),
    json_schema: z.strictObject({
      name: z.string().max(64).nullish(),
      description: z.string().nullish(),
      schema: jsonSchemaObject.nullish(),
      strict: z.boolean().nullish(),
    }),
  }),
], {
  error:
    'expected {type: "text"}, {type: "json_object"} or {type: "json_schema", json_schema: {...}}',
});

/** Zod fields for a body schema (both OpenAI endpoints). */
export const constraintFields = {
  response_format: ResponseFormat.nullish(),
  json_schema: jsonSchemaObject.nullish(),
  grammar: z.string().max(1 << 20).nullish(),
  guided_json: z.union([jsonSchemaObject, z.string()], {
    error: "expected a JSON Schema object or its JSON text",
  }).nullish(),
  guided_grammar: z.string().max(1 << 20).nullish(),
  guided_choice: z.array(z.string().min(1, { error: "a choice must not be empty" }).max(4096))
    .min(1, { error: "give at least one choice" }).max(1024).nullish(),
};

/** The WebSocket generate frame's fields (the same meaning, OpenAI's and llama-server's names). */
export const frameConstraintFields = {
  response_format: ResponseFormat.optional(),
  json_schema: jsonSchemaObject.optional(),
  grammar: z.string().max(1 << 20).optional(),
};

export interface ConstraintFields {
  readonly response_format?: z.output<typeof ResponseFormat> | null;
  readonly json_schema?: Record<string, unknown> | null;
  readonly grammar?: string | null;
  readonly guided_json?: Record<string, unknown> | string | null;
  readonly guided_grammar?: string | null;
  readonly guided_choice?: readonly string[] | null;
}

/**
 * The constraint a request asks for, or undefined. Throws a 400 naming the field: for two
 * constraints at once, for a schema keyword constrained decoding cannot enforce (its path in
 * the schema), for guided_json text that is not JSON.
 */
export function outputConstraint(b: ConstraintFields): OutputConstraint | undefined {
  const given: [string, OutputConstraint][] = [];
  const rf = b.response_format;
  if (rf && rf.type === "json_object") given.push(["response_format", { type: "json_object" }]);
  if (rf && rf.type === "json_schema") {
    const schema = rf.json_schema.schema ?? {};
    given.push(["response_format", schemaConstraint(schema, "response_format.json_schema.schema")]);
  }
  if (b.json_schema) given.push(["json_schema", schemaConstraint(b.json_schema, "json_schema")]);
  if (b.guided_json !== undefined && b.guided_json !== null) {
    let schema: unknown = b.guided_json;
    if (typeof schema === "string") {
      try {
        schema = JSON.parse(schema);
      } catch (e) {
        throw new ApiError(
          "invalid_request",
          `Invalid 'guided_json': not JSON (${(e as Error).message})`,
          "guided_json",
        );
      }
    }
    given.push(["guided_json", schemaConstraint(schema, "guided_json")]);
  }
  // llama-server sends grammar "" by default: no grammar.
  if (b.grammar) given.push(["grammar", { type: "grammar", grammar: b.grammar }]);
  if (b.guided_grammar) {
    given.push(["guided_grammar", { type: "grammar", grammar: b.guided_grammar }]);
  }
  if (b.guided_choice) {
    given.push(["guided_choice", { type: "grammar", grammar: choiceGrammar(b.guided_choice) }]);
  }
  if (given.length > 1) {
    throw new ApiError(
      "invalid_request",
      `Invalid '${given[1]![0]}': give one output constraint, not ${
        given.map(([f]) => `'${f}'`).join(" and ")
      }`,
      given[1]![0],
    );
  }
  return given[0]?.[1];
}

/** The field that gives the request's output constraint (the first, in outputConstraint's order). */
export function constraintField(b: ConstraintFields): string | undefined {
  const rf = b.response_format;
  if (rf && rf.type !== "text") return "response_format";
  if (b.json_schema) return "json_schema";
  if (b.guided_json !== undefined && b.guided_json !== null) return "guided_json";
  if (b.grammar) return "grammar";
  if (b.guided_grammar) return "guided_grammar";
  if (b.guided_choice) return "guided_choice";
  return undefined;
}

/**
 * vLLM's `guided_choice` as a grammar: the output is exactly one of the strings. Each is a
 * GBNF string literal, with the quote, the backslash and control characters escaped.
 *
 * ```ts
 * choiceGrammar(["yes", 'say "no"']); // 'root ::= "yes" | "say \\"no\\""'
 * ```
 */
export function choiceGrammar(choices: readonly string[]): string {
  const literal = (c: string) =>
    // deno-lint-ignore no-control-regex -- control characters are what it escapes
    '"' + c.replace(/[\\"\x00-\x1f\x7f]/g, (ch) => {
      if (ch === "\\" || ch === '"') return "\\" + ch;
      return "\\x" + ch.charCodeAt(0).toString(16).padStart(2, "0");
    }) + '"';
  return `root ::= ${[...new Set(choices)].map(literal).join(" | ")}`;
}

function schemaConstraint(schema: unknown, field: string): OutputConstraint {
  const problem = unsupportedSchemaPart(schema);
  if (problem) {
    const param = problem.path === "" ? field : `${field}.${problem.path}`;
    throw new ApiError("invalid_request", `Invalid '${param}': ${problem.message}`, param);
  }
  return { type: "json_schema", schema: JSON.stringify(schema) };
}
