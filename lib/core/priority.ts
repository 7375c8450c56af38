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
 * many batch steps rather than a full pipeline (and while "running" beside rank-1 work too:
 * see {@link rankOneLive}).
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

/**
 * Whether rank-1 work could use a step (live and its client reading). While it could and
 * rank-0 work only decodes, the pipeline is backgroundDepth deep, not pipelineDepth: batch
 * rows make a step longer (on the CPU engine 8 of them took a one-row decode step from 1.1 to
 * 2.6 ms), and an interactive arrival waits behind every step in flight, so a full pipeline of
 * such steps is what cost it most (bench/README.md, "Batch jobs beside interactive traffic").
 */
export function rankOneLive(live: Iterable<Sequence>, rankOf: (s: Sequence) => Rank): boolean {
  for (const seq of live) if (!seq.held && rankOf(seq) === 1) return true;
  return false;
}
