import type { Rank } from "./priority.ts";
import type { Sequence } from "./sequence.ts";

/**
 * The running sequence to preempt for `seq`: lowest rank, then most recently admitted, not
 * part of the step being built (`members`). For an admission (`strictlyLower`) only lower
 * ranks qualify; otherwise also equal ranks admitted after `seq`. `running` is in admission
 * order.
 */
export function pickVictim(
  running: readonly Sequence[],
  seq: Sequence,
  strictlyLower: boolean,
  members: ReadonlySet<Sequence>,
  rankOf: (s: Sequence) => Rank,
): Sequence | undefined {
  const rank = rankOf(seq);
  for (let r = 1; r >= rank; r--) {
    if (strictlyLower && r === rank) break;
    for (let i = running.length - 1; i >= 0; i--) {
      const s = running[i]!;
      if (s === seq || members.has(s) || rankOf(s) !== r) continue;
      if (r === rank && s.admitOrder < seq.admitOrder) break;
      return s;
    }
  }
  return undefined;
}

/**
 * Batch sequences that give their running slot to interactive work waiting for one, most
 * recently admitted first: the cap on running sequences must not let a batch load keep
 * interactive requests queued. They are recomputed later (their full blocks stay in the prefix
 * cache), and aging lifts them to interactive rank, so they are not starved.
 */
export function slotVictims(
  { waiting, running }: {
    readonly waiting: readonly Sequence[];
    readonly running: readonly Sequence[];
  },
  maxRunning: number,
  rankOf: (s: Sequence) => Rank,
): Sequence[] {
  const wanting = waiting.filter((s) => rankOf(s) === 0).length;
  const short = wanting - (maxRunning - running.length);
  const out: Sequence[] = [];
  for (let i = running.length - 1; i >= 0 && out.length < short; i--) {
    if (rankOf(running[i]!) === 1) out.push(running[i]!);
  }
  return out;
}
