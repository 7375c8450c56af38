/**
 * How far a regex or a GBNF grammar's counted repetition expands: XGrammar writes `x{0,1000}`
 * as up to 1000 copies of x, so `(a{0,1000}){0,1000}` becomes about 10^6 states. `states` is
 * the sum over atoms of the product of the upper bounds of the repetitions around each (a rule
 * counts as what its own text expands to; 0 without any counted repetition); `depth` the deepest
 * parenthesis nesting.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * assertEquals(repetitionOf("^(a{0,1000}){0,1000}$", "regex").states, 1_000_000);
 * assertEquals(repetitionOf('root ::= x{3}\nx ::= "ab"{0,5}', "grammar").states, 15);
 * ```
 */
export function repetitionOf(
  text: string,
  kind: "regex" | "grammar",
): { states: number; depth: number } {
  // Without counted repetition a text expands to nothing beyond its own size (maxBytes).
  if (kind === "regex") {
    const r = scan(text, kind, () => 1);
    return { states: r.counted ? r.states : 0, depth: r.depth };
  }
  const rules = splitRules(text);
  const memo = new Map<string, number>();
  const open = new Set<string>();
  let depth = 0;
  let counted = false;
  const ruleStates = (name: string): number => {
    const known = memo.get(name);
    if (known !== undefined) return known;
    const body = rules.get(name);
    // A recursive reference is a loop, not an expansion.
    if (body === undefined || open.has(name)) return 1;
    open.add(name);
    const r = scan(body, kind, ruleStates);
    open.delete(name);
    depth = Math.max(depth, r.depth);
    counted ||= r.counted;
    memo.set(name, r.states);
    return r.states;
  };
  let states = 0;
  for (const name of rules.keys()) states = Math.max(states, ruleStates(name));
  return { states: counted ? states : 0, depth };
}

/** GBNF rules by name: `name ::= body`, a body running to the next rule's head. */
function splitRules(text: string): Map<string, string> {
  const rules = new Map<string, string>();
  const heads = [...text.matchAll(/^[ \t]*([A-Za-z_][A-Za-z0-9_.-]*)[ \t]*::=/gm)];
  heads.forEach((h, i) => {
    const start = h.index + h[0].length;
    const end = heads[i + 1]?.index ?? text.length;
    rules.set(h[1]!, text.slice(start, end));
  });
  return rules;
}

interface Frame {
  sum: number;
  last: number;
}

function scan(
  text: string,
  kind: "regex" | "grammar",
  ruleStates: (name: string) => number,
): { states: number; depth: number; counted: boolean } {
  const stack: Frame[] = [{ sum: 0, last: 0 }];
  let depth = 0;
  let counted = false;
  const top = () => stack[stack.length - 1]!;
  const atom = (w: number) => {
    top().sum += w;
    top().last = w;
  };
  for (let i = 0; i < text.length; i++) {
    const ch = text[i]!;
    if (ch === "\\") {
      i++;
      atom(1);
    } else if (ch === "[") {
      i = closing(text, i, "]");
      atom(1);
    } else if (kind === "grammar" && ch === '"') {
      i = closing(text, i, '"');
      atom(1);
    } else if (kind === "grammar" && ch === "#") {
      while (i < text.length && text[i] !== "\n") i++;
    } else if (ch === "(") {
      stack.push({ sum: 0, last: 0 });
      depth = Math.max(depth, stack.length - 1);
    } else if (ch === ")" && stack.length > 1) {
      const inner = stack.pop()!;
      atom(Math.max(inner.sum, 1));
    } else if (ch === "{") {
      const m = /^\{\s*(\d*)\s*(,?)\s*(\d*)\s*\}/.exec(text.slice(i, i + 64));
      if (!m) {
        atom(1);
        continue;
      }
      const n = Number(m[1] || 0);
      const upper = m[2] === "" ? n : m[3] === "" ? n + 1 : Number(m[3]);
      counted = true;
      const f = top();
      f.sum += f.last * (Math.max(upper, 1) - 1);
      f.last *= Math.max(upper, 1);
      i += m[0].length - 1;
    } else if (kind === "grammar" && /[A-Za-z_]/.test(ch)) {
      const name = /^[A-Za-z_][A-Za-z0-9_.-]*/.exec(text.slice(i))![0];
      i += name.length - 1;
      atom(ruleStates(name));
    } else if (!/\s/.test(ch) && !"|*+?^$".includes(ch)) {
      atom(1);
    }
  }
  return { states: stack.reduce((s, f) => s + f.sum, 0), depth, counted };
}

/** The index of the unescaped `end` that closes what opens at `start`. */
function closing(text: string, start: number, end: string): number {
  for (let i = start + 1; i < text.length; i++) {
    if (text[i] === "\\") i++;
    else if (text[i] === end) return i;
  }
  return text.length;
}
