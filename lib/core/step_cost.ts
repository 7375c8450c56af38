/** The prompts waiting to be read, as the scheduler counts them. */
export interface PromptBacklog {
  /** Token rows not yet fed. */
  readonly rows: number;
  /** Prompts those rows belong to. */
  readonly prompts: number;
}

interface Fit {
  /** ms per step whatever it holds. */
  readonly a: number;
  /** ms per token row. */
  readonly b: number;
  /** ms more per sampled row (the classifier and the sampler). */
  readonly c: number;
}

/**
 * What a step costs the engine, learnt from the steps it ran: ms = a + b × rows + c × sampled,
 * a fixed part (reading the weights, per-step overheads), a part per token row and a part per
 * sampled row (logits over the whole vocabulary), fitted by least squares over the recent steps
 * (older ones weigh less, so the fit follows a machine whose load changes).
 *
 * The scheduler uses it to cut a burst of prompts into steps ({@link burstRows}): one step for
 * all of them gives every first token at the end of the whole burst, while one prompt per step
 * pays the step's fixed cost once per prompt. For N prompts of p rows taken m at a time, with F
 * the cost of a step without prompts (its fixed part and its decodes) and q = b × p + c a
 * prompt's, the mean time to first token is about (N/m + 1)/2 × (F + q × m), least at
 * m = √(N × F / q): steps of m × p prompt rows.
 *
 * @example
 * ```ts
 * import { assertAlmostEquals } from "@std/assert";
 *
 * const cost = new StepCost();
 * const steps: [number, number][] = [[1, 1], [4, 1], [32, 2], [8, 8], [64, 3], [2, 2]];
 * for (const [rows, sampled] of steps) cost.observe(rows, sampled, 40 + 12 * rows + 30 * sampled);
 * // 20 prompts of 16 rows, nothing decoding: F = 40, q = 12 × 16 + 30 = 222 ms a prompt,
 * // m = √(20 × 40 / 222) = 1.9 prompts, so about 30 prompt rows a step.
 * assertAlmostEquals(cost.burstRows({ rows: 320, prompts: 20 }, 0), 16 * Math.sqrt(800 / 222), 1e-6);
 * ```
 */
export class StepCost {
  /** Weight kept by the older observations at each new one. */
  static readonly DECAY = 0.95;
  /** Observations needed before the fit is used. */
  static readonly MIN_STEPS = 4;
  /** Weighted sums of 1, x1 (rows), x2 (sampled), y (ms) and their products. */
  #s = new Float64Array(9);
  #n = 0;

  /** A step of `rows` token rows, `sampled` of which sampled, kept the engine busy `ms`. */
  observe(rows: number, sampled: number, ms: number): void {
    if (!(rows > 0 && sampled >= 0 && sampled <= rows && ms >= 0 && Number.isFinite(ms))) return;
    const s = this.#s;
    for (let i = 0; i < s.length; i++) s[i]! *= StepCost.DECAY;
    const terms = [
      1,
      rows,
      sampled,
      ms,
      rows * rows,
      rows * sampled,
      sampled * sampled,
      rows * ms,
      sampled * ms,
    ];
    for (let i = 0; i < s.length; i++) s[i]! += terms[i]!;
    this.#n++;
  }

  /** ms per step whatever it holds, or undefined until the steps seen say. */
  get fixedMs(): number | undefined {
    return this.#fit()?.a;
  }

  /** ms per token row, or undefined until the steps seen say. */
  get perRowMs(): number | undefined {
    return this.#fit()?.b;
  }

  /** ms more per sampled row, or undefined until the steps seen say. */
  get perSampleMs(): number | undefined {
    return this.#fit()?.c;
  }

  /**
   * Prompt rows to put in one step while `backlog` waits beside `decodes` decoding sequences
   * (Infinity while the cost is unknown: no cut). The scheduler never cuts a prompt for it, only
   * stops starting the next one.
   */
  burstRows(backlog: PromptBacklog, decodes: number): number {
    const fit = this.#fit();
    if (!fit || backlog.prompts <= 0) return Infinity;
    const p = backlog.rows / backlog.prompts;
    const stepMs = fit.a + (fit.b + fit.c) * decodes;
    const promptMs = fit.b * p + fit.c;
    return p * Math.sqrt(backlog.prompts * stepMs / promptMs);
  }

  /**
   * Least squares on (rows, sampled); where the steps seen cannot tell the two apart (all
   * decodes, say), on rows alone. Undefined until a row's cost is known and positive.
   */
  #fit(): Fit | undefined {
    if (this.#n < StepCost.MIN_STEPS) return undefined;
    const [w, x1, x2, y, x11, x12, x22, x1y, x2y] = Array.from(this.#s, (v) => v / this.#s[0]!);
    void w;
    // Centred second moments.
    const v11 = x11! - x1! * x1!, v12 = x12! - x1! * x2!, v22 = x22! - x2! * x2!;
    const c1y = x1y! - x1! * y!, c2y = x2y! - x2! * y!;
    const det = v11 * v22 - v12 * v12;
    const scale = Math.max(1, x1! * x1!);
    if (!(v11 > 1e-9 * scale)) return undefined;
    let b = c1y / v11, c = 0;
    if (det > 1e-6 * v11 * Math.max(v22, 1e-9) && v22 > 1e-9) {
      b = (c1y * v22 - c2y * v12) / det;
      c = (c2y * v11 - c1y * v12) / det;
      if (!(c >= 0)) (b = c1y / v11, c = 0);
    }
    if (!(b > 0)) return undefined;
    return { a: Math.max(0, y! - b * x1! - c * x2!), b, c };
  }
}
