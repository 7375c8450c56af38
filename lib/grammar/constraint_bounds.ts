/**
 * The checks a constraint passes before XGrammar sees it: each bound of grammar_limits.ts that
 * it breaks is a ConstraintError (the client's 400) naming the bound, its limit and what the
 * request holds. They keep a compile short and inside XGrammar's stack; the compile budget of
 * grammar_service.ts catches whatever still slips through.
 */
import { ConstraintError } from "./constraint_error.ts";
import type { GrammarLimits } from "./grammar_limits.ts";
import type { OutputConstraint } from "./output_constraint.ts";
import { refCycleProblem } from "./ref_cycles.ts";
import { repetitionOf } from "./repetition.ts";

/** What a constraint asks of every output: the largest minLength/minItems it holds. */
export interface ConstraintNeeds {
  readonly minimum: number;
  /** Where that minimum sits ("minLength 5000"), for the error. */
  readonly what: string;
}

/**
 * Throws a ConstraintError for the first bound the constraint breaks; else what it needs of
 * every output (checked per request by checkRoom).
 *
 * ```ts
 * import { assertThrows } from "@std/assert";
 * import { GRAMMAR_LIMITS } from "./grammar_limits.ts";
 *
 * const c = { type: "json_schema", schema: '{"type":"string","pattern":"^(a{0,1000}){0,1000}$"}' } as const;
 * assertThrows(() => checkConstraintBounds(c, GRAMMAR_LIMITS), Error, "repetition");
 * ```
 */
export function checkConstraintBounds(c: OutputConstraint, limits: GrammarLimits): ConstraintNeeds {
  const none = { minimum: 0, what: "" };
  if (c.type === "json_object") return none;
  const text = c.type === "grammar" ? c.grammar : c.schema;
  const what = c.type === "grammar" ? "grammar" : "schema";
  const bytes = new TextEncoder().encode(text).length;
  if (bytes > limits.maxBytes) {
    refuse(`the ${what} is ${bytes} bytes; the limit is ${limits.maxBytes}`);
  }
  if (c.type === "grammar") {
    checkRepetition(repetitionOf(c.grammar, "grammar"), "the grammar", limits);
    return none;
  }
  let schema: unknown;
  try {
    schema = JSON.parse(c.schema);
  } catch {
    return none; // XGrammar refuses it with its own reason, without trapping
  }
  const depth = jsonDepth(schema);
  if (depth > limits.maxDepth) {
    refuse(
      `the schema nests ${depth} levels deep (objects and arrays of its JSON); the limit is ${limits.maxDepth}`,
    );
  }
  const walk = new SchemaWalk(limits);
  walk.visit(schema, "");
  if (walk.enumValues > limits.maxEnumValues) {
    refuse(
      `the schema's enums hold ${walk.enumValues} values in all; the limit is ${limits.maxEnumValues}`,
    );
  }
  const cycle = refCycleProblem(schema);
  if (cycle) refuse(cycle);
  // Free text, the other branch, needs no room.
  return c.type === "json_schema_or_text" ? none : walk.needs;
}

/** Throws a ConstraintError when no output of at most `maxTokens` tokens can meet `needs`. */
export function checkRoom(needs: ConstraintNeeds, maxTokens: number, longestToken: number): void {
  const room = maxTokens * longestToken;
  if (needs.minimum > room) {
    refuse(
      `${needs.what} cannot be written in ${maxTokens} tokens (max_tokens, or the room the context ` +
        `leaves: at most ${room} characters with this vocabulary's longest token of ${longestToken} bytes)`,
    );
  }
}

function refuse(why: string): never {
  throw new ConstraintError(`Output constraint over a limit: ${why}`);
}

function checkRepetition(
  r: { states: number; depth: number },
  where: string,
  limits: GrammarLimits,
): void {
  if (r.depth > limits.maxDepth) {
    refuse(`${where} nests parentheses ${r.depth} deep; the limit is ${limits.maxDepth}`);
  }
  if (r.states > limits.maxRepetition) {
    refuse(
      `${where}'s counted repetition expands to ${
        r.states > 1e15 ? r.states.toExponential(1) : r.states
      } states (the product of nested {n,m} bounds); the limit is ${limits.maxRepetition}`,
    );
  }
}

/** The nesting depth of a JSON value (objects and arrays), without recursion. */
export function jsonDepth(value: unknown): number {
  let deepest = 0;
  const stack: [unknown, number][] = [[value, 0]];
  while (stack.length > 0) {
    const [v, d] = stack.pop()!;
    if (typeof v !== "object" || v === null) continue;
    deepest = Math.max(deepest, d + 1);
    for (const child of Object.values(v)) stack.push([child, d + 1]);
  }
  return deepest;
}

/** Keywords whose values are data, not schemas: a "pattern" inside an enum value is a string. */
const DATA_KEYWORDS = new Set(["enum", "const", "default", "examples"]);

/** Counts enum values, checks lengths and patterns, and finds the largest minimum. */
class SchemaWalk {
  enumValues = 0;
  needs: ConstraintNeeds = { minimum: 0, what: "" };
  #limits: GrammarLimits;

  constructor(limits: GrammarLimits) {
    this.#limits = limits;
  }

  /** Depth is bounded by jsonDepth first, so recursion here stays shallow. */
  visit(node: unknown, path: string): void {
    if (typeof node !== "object" || node === null) return;
    if (Array.isArray(node)) {
      node.forEach((n, i) => this.visit(n, `${path}[${i}]`));
      return;
    }
    for (const [key, value] of Object.entries(node)) {
      const at = path === "" ? key : `${path}.${key}`;
      if (key === "enum" && Array.isArray(value)) this.enumValues += value.length;
      if (key === "pattern" && typeof value === "string") {
        checkRepetition(repetitionOf(value, "regex"), `pattern at '${at}'`, this.#limits);
      }
      if (typeof value === "number") this.#bound(key, value, at);
      if (!DATA_KEYWORDS.has(key)) this.visit(value, at);
    }
  }

  #bound(key: string, value: number, at: string): void {
    if (!["minLength", "maxLength", "minItems", "maxItems"].includes(key)) return;
    const limit = this.#limits.maxLengthBound;
    if (value > limit) refuse(`'${at}' is ${value}; the limit for ${key} is ${limit}`);
    if (key.startsWith("min") && value > this.needs.minimum) {
      this.needs = { minimum: value, what: `'${at}' (${value})` };
    }
  }
}
