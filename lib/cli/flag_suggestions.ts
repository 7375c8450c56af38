/**
 * What a command says of the flags it does not take: one line, each unknown flag with the
 * nearest known one when a typo is likely ("did you mean"), and the flags of other servers
 * that mean something different here, with what to use instead. The whole usage text is for
 * `--help`: printed after one typo it buried the one line that mattered.
 */
import { PEER_FLAGS } from "./settings.ts";

/** The one-line error for `unknown` flags of a command whose flags are `known` (no dashes). */
export function unknownArgumentsError(
  unknown: readonly string[],
  known: readonly string[],
  command: string,
): string {
  const each = unknown.map((typed) => {
    const near = nearestFlag(typed.replace(/^-+/, "").split("=")[0]!, known);
    return near === undefined ? typed : `${typed} (did you mean --${near}?)`;
  });
  return `Unknown argument(s): ${each.join(", ")}; \`${command} --help\` lists every flag`;
}

/** The error for a peer's flag (settings.ts PEER_FLAGS), named as the user typed it. */
export function peerFlagError(flag: string, typed: string): string {
  return `${typed} is not a flag here: ${PEER_FLAGS[flag]?.instead ?? "no flag does that job"}`;
}

/**
 * The known flag nearest to `name` by edit distance, when it is close enough to be a typo:
 * at most a third of the name's length, so `--prot` finds `--port` but `-q` finds nothing.
 */
export function nearestFlag(name: string, known: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestDistance = Math.max(1, Math.floor(name.length / 3)) + 1;
  for (const k of known) {
    const d = k.startsWith(name) && name.length >= 3 ? 1 : editDistance(name, k);
    if (d < bestDistance) [best, bestDistance] = [k, d];
  }
  return best;
}

/** Levenshtein distance, with a swap of two neighbours counted as one edit. */
function editDistance(a: string, b: string): number {
  const rows: number[][] = [];
  for (let i = 0; i <= a.length; i++) {
    rows.push([i]);
    for (let j = 1; j <= b.length; j++) {
      if (i === 0) {
        rows[0]!.push(j);
        continue;
      }
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let d = Math.min(rows[i - 1]![j]! + 1, rows[i]![j - 1]! + 1, rows[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) {
        d = Math.min(d, rows[i - 2]![j - 2]! + 1);
      }
      rows[i]!.push(d);
    }
  }
  return rows[a.length]![b.length]!;
}
