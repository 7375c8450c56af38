/** Latency summaries for the benchmarks. */

/** Distribution summary of a list of samples (milliseconds, tokens, ...). */
export interface Summary {
  readonly n: number;
  readonly mean: number;
  readonly p50: number;
  readonly p90: number;
  readonly p99: number;
  readonly max: number;
}

/**
 * The nearest-rank percentile (the smallest sample with at least p% of samples at or below it),
 * so every reported figure is a latency some request really had. NaN for no samples.
 */
export function percentile(sortedAscending: readonly number[], p: number): number {
  const n = sortedAscending.length;
  if (n === 0) return NaN;
  const rank = Math.max(1, Math.ceil((p / 100) * n));
  return sortedAscending[Math.min(n, rank) - 1]!;
}

/** Mean, p50, p90, p99 and max of `values` (NaN fields when empty). */
export function summarize(values: readonly number[]): Summary {
  const sorted = [...values].sort((a, b) => a - b);
  const n = sorted.length;
  const mean = n === 0 ? NaN : sorted.reduce((s, v) => s + v, 0) / n;
  return {
    n,
    mean,
    p50: percentile(sorted, 50),
    p90: percentile(sorted, 90),
    p99: percentile(sorted, 99),
    max: n === 0 ? NaN : sorted[n - 1]!,
  };
}

/** A number for a table cell: fixed decimals, "–" for NaN/undefined. */
export function fmt(v: number | undefined, digits = 1): string {
  return v === undefined || !Number.isFinite(v) ? "–" : v.toFixed(digits);
}

/** `a / b` as "1.23×", "–" when either is missing or b is 0. */
export function ratio(a: number | undefined, b: number | undefined, digits = 2): string {
  if (a === undefined || b === undefined || !Number.isFinite(a) || !Number.isFinite(b) || b === 0) {
    return "–";
  }
  return `${(a / b).toFixed(digits)}×`;
}

/** A share as a percentage with one decimal. */
export function pct(share: number | undefined, digits = 1): string {
  return share === undefined || !Number.isFinite(share) ? "–" : `${(share * 100).toFixed(digits)}%`;
}

export { markdownTable as table } from "./markdown_table.ts";
