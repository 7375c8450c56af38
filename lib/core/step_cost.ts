/**
 * What a step costs the engine, learnt from the steps it ran: a fixed part per step (reading
 * the weights once, the per-step overheads) and a part per token row, fitted as
 * ms = fixedMs + perRowMs × rows by least squares over the recent steps (older ones weigh less,
 * so the fit follows a machine whose load changes).
 *
 * The scheduler uses it to cut a burst of prompts into steps ({@link burstRows}): one step for
 * all of them gives every first token at the end of the whole burst, while one prompt per step
 * pays the fixed cost once per prompt. With a backlog of W rows, steps of about
 * sqrt(fixedMs × W / perRowMs) rows give the least mean time to first token (for N prompts of p
 * rows taken m at a time, the mean is about (N/m + 1)/2 × (fixedMs + perRowMs × m × p), least
 * at m × p = sqrt(fixedMs × N × p / perRowMs)).
 *
 * @example
 * ```ts
 * import { assertAlmostEquals } from "@std/assert";
 *
 * const cost = new StepCost();
 * for (const rows of [1, 4, 32, 8, 64, 2]) cost.observe(rows, 40 + 12 * rows);
 * assertAlmostEquals(cost.fixedMs!, 40, 1e-6);
 * assertAlmostEquals(cost.perRowMs!, 12, 1e-6);
 * // A backlog of 320 prompt rows: steps of about 33 rows, not all 320 in one.
 * assertAlmostEquals(cost.burstRows(320), Math.sqrt(40 * 320 / 12), 1e-6);
 * ```
 */
export class StepCost {
  /** Weight kept by the older observations at each new one. */
  static readonly DECAY = 0.95;
  /** Observations (and a spread of row counts) needed before the fit is used. */
  static readonly MIN_STEPS = 4;
  #w = 0;
  #x = 0;
  #y = 0;
  #xx = 0;
  #xy = 0;
  #n = 0;

  /** A step of `rows` token rows kept the engine busy `ms`. */
  observe(rows: number, ms: number): void {
    if (!(rows > 0 && ms >= 0 && Number.isFinite(ms))) return;
    const d = StepCost.DECAY;
    this.#w = this.#w * d + 1;
    this.#x = this.#x * d + rows;
    this.#y = this.#y * d + ms;
    this.#xx = this.#xx * d + rows * rows;
    this.#xy = this.#xy * d + rows * ms;
    this.#n++;
  }

  /** ms per token row, or undefined until the steps seen say. */
  get perRowMs(): number | undefined {
    return this.#fit()?.b;
  }

  /** ms per step whatever its rows, or undefined until the steps seen say. */
  get fixedMs(): number | undefined {
    return this.#fit()?.a;
  }

  /**
   * Prompt rows to put in one step while `backlogRows` rows of prompts wait (Infinity while the
   * cost is unknown: no cut). The scheduler never cuts a prompt for it, only stops admitting
   * the next one.
   */
  burstRows(backlogRows: number): number {
    const fit = this.#fit();
    if (!fit) return Infinity;
    return Math.sqrt(fit.a * backlogRows / fit.b);
  }

  #fit(): { a: number; b: number } | undefined {
    if (this.#n < StepCost.MIN_STEPS) return undefined;
    const w = this.#w, mx = this.#x / w, my = this.#y / w;
    const varX = this.#xx / w - mx * mx;
    // Steps all of one size say nothing of what a row costs.
    if (!(varX > 1e-9 * Math.max(1, mx * mx))) return undefined;
    const b = (this.#xy / w - mx * my) / varX;
    if (!(b > 0)) return undefined;
    return { a: Math.max(0, my - b * mx), b };
  }
}
