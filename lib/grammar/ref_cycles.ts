/**
 * `$ref` cycles with no base case: a definition that can only be written by writing itself
 * again (`{"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/a"}},
 * "required": ["b"]}}}`). XGrammar compiles it into a rule that never ends, and the request
 * came back 200 with empty text (issue 37). A schema is "productive" when some finite JSON
 * value matches it; references are solved as a least fixpoint (every reference starts
 * unproductive and becomes productive once some way out of it is found).
 */

type Schema = Record<string, unknown>;

/**
 * Why the schema holds a reference that cannot be written, or undefined.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const loop = { $ref: "#/$defs/a", $defs: { a: { type: "array", items: { $ref: "#/$defs/a" }, minItems: 1 } } };
 * assertEquals(refCycleProblem(loop)?.includes("#/$defs/a"), true);
 * assertEquals(refCycleProblem({ ...loop, $defs: { a: { ...loop.$defs.a, minItems: 0 } } }), undefined);
 * ```
 */
export function refCycleProblem(root: unknown): string | undefined {
  const refs = new Set<string>();
  collectRefs(root, refs);
  if (refs.size === 0) return undefined;
  const productive = new Map<string, boolean>([...refs].map((r) => [r, false]));
  for (let changed = true; changed;) {
    changed = false;
    for (const ref of refs) {
      if (productive.get(ref)) continue;
      const target = resolve(root, ref);
      if (target === undefined || canWrite(target, productive)) {
        productive.set(ref, true);
        changed = true;
      }
    }
  }
  const stuck = [...refs].filter((r) => !productive.get(r));
  if (stuck.length === 0) return undefined;
  return `'$ref' cycle with no base case: ${
    stuck.join(", ")
  } can only be written by writing itself again (give the recursion an optional way out)`;
}

function collectRefs(node: unknown, refs: Set<string>): void {
  if (typeof node !== "object" || node === null) return;
  for (const [key, value] of Object.entries(node)) {
    if (key === "$ref" && typeof value === "string" && value.startsWith("#")) refs.add(value);
    else if (key !== "enum" && key !== "const") collectRefs(value, refs);
  }
}

/** The schema a "#/a/b" reference names (JSON pointer, ~0 and ~1 decoded). */
function resolve(root: unknown, ref: string): unknown {
  const path = ref.slice(1);
  if (path === "") return root;
  let node: unknown = root;
  for (const raw of path.split("/").slice(1)) {
    const key = decodeURIComponent(raw).replaceAll("~1", "/").replaceAll("~0", "~");
    if (typeof node !== "object" || node === null) return undefined;
    node = (node as Schema)[key];
  }
  return node;
}

/** Whether some finite value matches `s`, given which references are known productive. */
function canWrite(s: unknown, refs: Map<string, boolean>): boolean {
  if (typeof s === "boolean") return s;
  if (typeof s !== "object" || s === null) return true;
  const o = s as Schema;
  if (typeof o.$ref === "string" && refs.has(o.$ref) && !refs.get(o.$ref)) return false;
  if (Array.isArray(o.anyOf) && !o.anyOf.some((b) => canWrite(b, refs))) return false;
  const props = (o.properties ?? {}) as Schema;
  if (Array.isArray(o.required)) {
    for (const name of o.required) {
      if (typeof name === "string" && name in props && !canWrite(props[name], refs)) return false;
    }
  }
  const min = typeof o.minItems === "number" ? o.minItems : 0;
  const prefix = Array.isArray(o.prefixItems) ? o.prefixItems : [];
  for (let i = 0; i < Math.min(min, prefix.length); i++) {
    if (!canWrite(prefix[i], refs)) return false;
  }
  if (min > prefix.length && o.items !== undefined && !canWrite(o.items, refs)) return false;
  return true;
}
