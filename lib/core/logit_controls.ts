import { type LogitAdjust, SUPPRESS_BIAS } from "../engine/logit_adjust.ts";
import { f32Problem } from "../util/f32_problem.ts";

/**
 * The repetition penalty's range: vLLM's (0, 2], but at least 1e-6, since the penalty divides
 * positive logits and below ~1e-37 that overflows f32 to Infinity (garbage text, no error).
 */
export const REPETITION_PENALTY = { min: 1e-6, max: 2 } as const;

/**
 * What a request asks of the logits beyond temperature and the cuts: OpenAI's logit_bias and
 * presence/frequency penalties, vLLM's and llama.cpp's repetition penalty, vLLM's min_tokens.
 * Every field at its default changes nothing.
 */
export interface LogitControls {
  /** [token id, bias] pairs, ids distinct: added to the logit (OpenAI: -100..100). */
  readonly logitBias?: readonly (readonly [number, number])[];
  /** Subtracted once from every token already generated (OpenAI: -2..2). */
  readonly presencePenalty?: number;
  /** Subtracted per occurrence in the generated tokens (OpenAI: -2..2). */
  readonly frequencyPenalty?: number;
  /**
   * Divides a positive logit and multiplies a negative one of every token in the last
   * `repeatLastN` tokens of prompt and output (vLLM, llama.cpp); 1 is off.
   */
  readonly repetitionPenalty?: number;
  /** Window of the repetition penalty: -1 (default) the whole sequence, 0 none. */
  readonly repeatLastN?: number;
  /** The stop token ids (EOS included) cannot be sampled before this many tokens. */
  readonly minTokens?: number;
}

/** Whether any field would change a logit. */
export function hasLogitControls(c: LogitControls | undefined): c is LogitControls {
  return c !== undefined &&
    ((c.logitBias?.length ?? 0) > 0 || historyDependent(c) || (c.minTokens ?? 0) > 0);
}

/** Whether the adjustment depends on the tokens so far (so needs every one of them known). */
export function historyDependent(c: LogitControls | undefined): boolean {
  if (c === undefined) return false;
  const rep = (c.repetitionPenalty ?? 1) !== 1 && (c.repeatLastN ?? -1) !== 0;
  return rep || (c.presencePenalty ?? 0) !== 0 || (c.frequencyPenalty ?? 0) !== 0;
}

/**
 * Why the controls cannot run on a vocabulary of `vocab` ids (0: unknown), or undefined. The
 * edge refuses bad values with a 400 first; this keeps one bad request from failing a step
 * shared with others.
 */
export function logitControlsProblem(c: LogitControls, vocab: number): string | undefined {
  const seen = new Set<number>();
  for (const [id, bias] of c.logitBias ?? []) {
    if (!Number.isInteger(id) || id < 0 || (vocab > 0 && id >= vocab)) {
      return `logit bias token id ${id} is outside the vocabulary of ${vocab} ids`;
    }
    if (seen.has(id)) return `logit bias lists token id ${id} twice`;
    seen.add(id);
    const problem = f32Problem(bias, {});
    if (problem !== undefined) return `logit bias of token ${id} is ${bias}: ${problem}`;
  }
  // As the engine will hold them: f32, where 1e-300 is 0 and 1e39 infinite.
  const penalties = [["presence", c.presencePenalty], ["frequency", c.frequencyPenalty]] as const;
  for (const [name, v] of penalties) {
    const problem = v === undefined ? undefined : f32Problem(v, {});
    if (problem !== undefined) return `the ${name} penalty is ${v}: ${problem}`;
  }
  const r = c.repetitionPenalty;
  const problem = r === undefined ? undefined : f32Problem(r, REPETITION_PENALTY);
  if (problem !== undefined) return `the repetition penalty is ${r}: ${problem}`;
  const n = c.repeatLastN;
  if (n !== undefined && !(Number.isInteger(n) && n >= -1)) {
    return `repeatLastN is ${n}, expected an integer >= -1`;
  }
  const m = c.minTokens;
  if (m !== undefined && !(Number.isInteger(m) && m >= 0)) {
    return `minTokens is ${m}, expected an integer >= 0`;
  }
  return undefined;
}

/**
 * One sequence's counts for its penalties, kept beside its tokens by the scheduler: rebuilt
 * from the tokens alone (prompt, then output from `outputStart`), so a preempted or recomputed
 * sequence, or one a router resubmits with the tokens it delivered, carries the same state.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * // Prompt [1], output so far [7] (from index 1), stop id 2.
 * const s = new PenaltyState({ frequencyPenalty: 0.5 }, [1, 7], 1, [2]);
 * const adj = s.adjust(2)!; // for the token at position 2
 * assertEquals([[...adj.ids], [...adj.subtract]], [[7], [0.5]]); // token 7 output once: -0.5
 * ```
 */
export class PenaltyState {
  readonly #c: LogitControls;
  readonly #outputStart: number;
  readonly #stopIds: readonly number[];
  /** Generated tokens' counts (presence and frequency). */
  readonly #output = new Map<number, number>();
  /** Counts over the repetition window. */
  readonly #window = new Map<number, number>();
  readonly #tokens: number[] = [];
  readonly #usesOutput: boolean;
  readonly #usesWindow: boolean;
  /** The bias-only adjustment (no penalties, no suppression), made once. */
  #static: LogitAdjust | undefined;

  constructor(
    controls: LogitControls,
    tokens: readonly number[],
    outputStart: number,
    stopIds: readonly number[],
  ) {
    this.#c = controls;
    this.#outputStart = outputStart;
    this.#stopIds = [...new Set(stopIds)];
    this.#usesOutput = (controls.presencePenalty ?? 0) !== 0 ||
      (controls.frequencyPenalty ?? 0) !== 0;
    this.#usesWindow = (controls.repetitionPenalty ?? 1) !== 1 &&
      (controls.repeatLastN ?? -1) !== 0;
    for (const t of tokens) this.push(t);
  }

  /** Adds the sequence's next token (prompt or output, in order). */
  push(token: number): void {
    const at = this.#tokens.length;
    this.#tokens.push(token);
    if (this.#usesOutput && at >= this.#outputStart) bump(this.#output, token, 1);
    if (this.#usesWindow) {
      bump(this.#window, token, 1);
      const n = this.#c.repeatLastN ?? -1;
      if (n > 0 && at - n >= 0) bump(this.#window, this.#tokens[at - n]!, -1);
    }
  }

  /**
   * The adjustment of the row that samples the token at `position` (every earlier token must
   * have been pushed when penalties apply); undefined when it changes nothing.
   */
  adjust(position: number): LogitAdjust | undefined {
    const suppress = position - this.#outputStart < (this.#c.minTokens ?? 0);
    if (!suppress && !this.#usesOutput && !this.#usesWindow) {
      return (this.#static ??= this.#build(false));
    }
    return this.#build(suppress);
  }

  #build(suppress: boolean): LogitAdjust | undefined {
    const c = this.#c;
    const ids = new Set<number>();
    for (const [id] of c.logitBias ?? []) ids.add(id);
    if (this.#usesOutput) { for (const id of this.#output.keys()) ids.add(id); }
    if (this.#usesWindow) { for (const id of this.#window.keys()) ids.add(id); }
    if (suppress) { for (const id of this.#stopIds) ids.add(id); }
    if (ids.size === 0) return undefined;
    const bias = new Map(c.logitBias ?? []);
    const n = ids.size;
    const out = {
      ids: new Int32Array(n),
      bias: new Float32Array(n),
      penalty: new Float32Array(n),
      subtract: new Float32Array(n),
    };
    const stops = suppress ? new Set(this.#stopIds) : undefined;
    let i = 0;
    for (const id of [...ids].sort((a, b) => a - b)) {
      const count = this.#output.get(id) ?? 0;
      out.ids[i] = id;
      out.bias[i] = stops?.has(id) ? SUPPRESS_BIAS : bias.get(id) ?? 0;
      out.penalty[i] = this.#window.has(id) ? c.repetitionPenalty! : 1;
      out.subtract[i] = count > 0
        ? (c.frequencyPenalty ?? 0) * count + (c.presencePenalty ?? 0)
        : 0;
      i++;
    }
    return out;
  }
}

function bump(m: Map<number, number>, id: number, by: number): void {
  const n = (m.get(id) ?? 0) + by;
  if (n === 0) m.delete(id);
  else m.set(id, n);
}
