/**
 * A seeded generator of JSON Schemas for constrained-decoding tests: objects (random required
 * subsets, additionalProperties false), arrays, enums, consts, integers and numbers, booleans,
 * null, anyOf, and $defs referenced through $ref, nested a few levels. Every string has a
 * maxLength or is an enum, every integer a range and every fractional number an enum, so the shortest valid output stays short:
 * a random-weight model at temperature 1 finishes it well within the tests' max_tokens.
 */
import { seededRandom } from "../lib/util/seeded_random.ts";

type Schema = Record<string, unknown>;

export function randomSchemas(count: number, seed: number): Schema[] {
  const random = seededRandom(seed);
  const int = (lo: number, hi: number) => lo + Math.floor(random() * (hi - lo + 1));
  const pick = <T>(xs: readonly T[]): T => xs[int(0, xs.length - 1)]!;
  const name = () => pick(["a", "b", "id", "x1", "ok", "n", "tag", "v"]);

  const leaf = (): Schema => {
    switch (int(0, 7)) {
      case 0:
        return {
          type: "string",
          maxLength: int(1, 4),
          ...(random() < 0.3 ? { minLength: 1 } : {}),
        };
      case 1: {
        const lo = int(-20, 20);
        return { type: "integer", minimum: lo, maximum: lo + int(0, 200) };
      }
      case 2:
        // An unbounded {"type": "number"} lets a random model write digits for ever.
        return { enum: [1.5, -2.25, 0, 1e3] };
      case 3:
        return { type: "boolean" };
      case 4:
        return { type: "null" };
      case 5:
        return { enum: pick([["red", "green", "blue"], [1, 2, 3], ["x", 7, null, true]]) };
      case 6:
        return { const: pick(["fixed", 42, false]) };
      default:
        return { type: ["integer", "null"], minimum: 0, maximum: 9 };
    }
  };

  const node = (depth: number, defs: string[]): Schema => {
    const roll = random();
    if (depth <= 0 || roll < 0.35) {
      if (defs.length > 0 && random() < 0.25) return { $ref: `#/$defs/${pick(defs)}` };
      return leaf();
    }
    if (roll < 0.65) return object(depth - 1, defs);
    if (roll < 0.85) {
      const items = node(depth - 1, defs);
      return {
        type: "array",
        items,
        maxItems: int(1, 3),
        ...(random() < 0.4 ? { minItems: 1 } : {}),
      };
    }
    return { anyOf: [node(depth - 1, defs), leaf()] };
  };

  const object = (depth: number, defs: string[]): Schema => {
    const names = [...new Set(Array.from({ length: int(1, 3) }, name))];
    const properties: Schema = {};
    for (const n of names) properties[n] = node(depth, defs);
    const required = names.filter(() => random() < 0.6);
    return {
      type: "object",
      properties,
      ...(required.length > 0 ? { required } : {}),
      additionalProperties: false,
    };
  };

  return Array.from({ length: count }, () => {
    const defs: Schema = {};
    const defNames: string[] = [];
    if (random() < 0.3) {
      for (const d of ["item", "point"].slice(0, int(1, 2))) {
        defs[d] = object(0, []);
        defNames.push(d);
      }
    }
    const root = object(int(1, 2), defNames);
    return defNames.length > 0 ? { ...root, $defs: defs } : root;
  });
}
