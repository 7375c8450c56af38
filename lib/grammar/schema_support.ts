/**
 * Which JSON Schema keywords constrained decoding enforces. XGrammar turns a schema into a
 * grammar, but it passes over some keywords without a word (uniqueItems, contains,
 * dependentRequired, … measured on 0.1.27: the grammar comes out the same with or without
 * them), so output made under it would not validate. Every keyword is therefore either
 * enforced, an annotation that cannot make output invalid, or refused, naming it.
 */

/** Keywords whose every use the grammar enforces. */
const ENFORCED = new Set([
  "type",
  "enum",
  "const",
  "properties",
  "required",
  "additionalProperties",
  "items",
  "prefixItems",
  "minItems",
  "maxItems",
  "minLength",
  "maxLength",
  "pattern",
  "format",
  "minimum",
  "maximum",
  "exclusiveMinimum",
  "exclusiveMaximum",
  "anyOf",
  "$ref",
  "$defs",
  "definitions",
]);

/** Keywords that describe and never constrain. */
const ANNOTATIONS = new Set([
  "title",
  "description",
  "default",
  "examples",
  "$schema",
  "$id",
  "$comment",
  "deprecated",
  "readOnly",
  "writeOnly",
]);

/** Why a keyword that looks supported is refused. */
const REFUSED_WHY: Record<string, string> = {
  oneOf: "it would be enforced as anyOf (output matching two branches would be invalid); use anyOf",
  allOf: "the grammar does not merge schemas",
  not: "the grammar cannot exclude a schema",
  uniqueItems: "the grammar cannot compare array items",
  contains: "the grammar does not check it",
  multipleOf: "the grammar does not check it",
  minProperties: "the grammar does not check it",
  maxProperties: "the grammar does not check it",
  patternProperties: "the grammar does not check it",
  propertyNames: "the grammar does not check it",
};

/** Formats the grammar spells out (XGrammar's list). */
const FORMATS = new Set([
  "date",
  "time",
  "date-time",
  "duration",
  "email",
  "uuid",
  "ipv4",
  "ipv6",
  "hostname",
  "uri",
]);

export interface SchemaProblem {
  /** JSON-pointer-like path below the schema, "" for its root ("properties.a.items"). */
  readonly path: string;
  readonly keyword: string;
  readonly message: string;
}

/**
 * The first thing in a schema constrained decoding cannot enforce, or undefined when it can
 * enforce all of it.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * assertEquals(unsupportedSchemaPart({ type: "array", uniqueItems: true })?.keyword, "uniqueItems");
 * assertEquals(unsupportedSchemaPart({ type: "array", items: { type: "string" } }), undefined);
 * ```
 */
export function unsupportedSchemaPart(schema: unknown): SchemaProblem | undefined {
  return walk(schema, "");
}

function at(path: string, key: string): string {
  return path === "" ? key : `${path}.${key}`;
}

function walk(s: unknown, path: string): SchemaProblem | undefined {
  if (typeof s === "boolean") return undefined;
  if (typeof s !== "object" || s === null || Array.isArray(s)) {
    return {
      path,
      keyword: "",
      message: `a schema must be an object or a boolean, got ${JSON.stringify(s)}`,
    };
  }
  const o = s as Record<string, unknown>;
  for (const [key, value] of Object.entries(o)) {
    if (ANNOTATIONS.has(key)) continue;
    if (!ENFORCED.has(key)) {
      const why = REFUSED_WHY[key] ?? "this server cannot enforce it";
      return {
        path: at(path, key),
        keyword: key,
        message: `keyword '${key}' is not supported: ${why}`,
      };
    }
    const sub = checkValue(key, value, at(path, key), o);
    if (sub) return sub;
  }
  return undefined;
}

function checkValue(
  key: string,
  value: unknown,
  path: string,
  parent: Record<string, unknown>,
): SchemaProblem | undefined {
  const bad = (message: string): SchemaProblem => ({ path, keyword: key, message });
  switch (key) {
    case "properties":
    case "$defs":
    case "definitions": {
      if (typeof value !== "object" || value === null || Array.isArray(value)) {
        return bad(`'${key}' must be an object of schemas`);
      }
      for (const [name, sub] of Object.entries(value)) {
        const p = walk(sub, at(path, name));
        if (p) return p;
      }
      return undefined;
    }
    case "items":
    case "additionalProperties":
      return walk(value, path);
    case "prefixItems":
    case "anyOf": {
      if (!Array.isArray(value) || (key === "anyOf" && value.length === 0)) {
        return bad(`'${key}' must be a${key === "anyOf" ? " non-empty" : "n"} array of schemas`);
      }
      for (let i = 0; i < value.length; i++) {
        const p = walk(value[i], at(path, String(i)));
        if (p) return p;
      }
      return undefined;
    }
    case "$ref":
      return typeof value === "string" && value.startsWith("#") ? undefined : bad(
        `only references inside the schema ("#/$defs/…") are supported, got ${
          JSON.stringify(value)
        }`,
      );
    case "format":
      return typeof value === "string" && FORMATS.has(value) ? undefined : bad(
        `format ${JSON.stringify(value)} is not supported (supported: ${[...FORMATS].join(", ")})`,
      );
    case "minimum":
    case "maximum":
    case "exclusiveMinimum":
    case "exclusiveMaximum":
      // XGrammar 0.1.27 writes a fractional bound's "." into a regex unescaped ("0.5" then
      // also admits "0x5"); integer bounds come out right.
      if (typeof value !== "number" || !Number.isInteger(value)) {
        return bad(`'${key}' must be an integer here, got ${JSON.stringify(value)}`);
      }
      if (
        parent.type === "number" || (Array.isArray(parent.type) && parent.type.includes("number"))
      ) {
        return bad(`'${key}' is supported on integers only, not on type number`);
      }
      return undefined;
    default:
      return undefined;
  }
}
