import type { Sequence } from "./sequence.ts";

/** 0: interactive (or aged batch) work; 1: batch work, which fills what rank 0 leaves idle. */
export type Rank = 0 | 1;

/** Batch work ranks like interactive work once it has waited `agingSteps` (so it never starves). */
export function rank(seq: Sequence, step: number, agingSteps: number): Rank {
  return seq.priority === "interactive" || step - seq.arrivalStep >= agingSteps ? 0 : 1;
}

/** Rank 0 first, then rank 1, each keeping the list's order. */
export function byPriority(list: readonly Sequence[], rankOf: (s: Sequence) => Rank): Sequence[] {
  const high: Sequence[] = [], low: Sequence[] = [];
  for (const s of list) (rankOf(s) === 0 ? high : low).push(s);
  return high.length === 0 ? low : low.length === 0 ? high : high.concat(low);
}

/**
 * What rank-0 work can use the next step: "starting" while one waits for admission or still
 * has prompt (or a recomputation) to read, "running" while rank-0 work only decodes, "none"
 * when all live work is rank 1 (or its clients stopped reading). While "starting", rank-1 rows
 * yield the whole step, so an interactive prefill shares its step with no batch work; while
 * "none", only backgroundDepth steps run ahead, so an interactive arrival waits behind that
 * many batch steps rather than a full pipeline.
 */
export function foreground(
  live: Iterable<Sequence>,
  rankOf: (s: Sequence) => Rank,
): "starting" | "running" | "none" {
  let running = false;
  for (const seq of live) {
    if (seq.held || rankOf(seq) === 1) continue;
    if (seq.status === "waiting" || (seq.pending === 0 && seq.unfed >= 2)) return "starting";
    running = true;
  }
  return running ? "running" : "none";
}
