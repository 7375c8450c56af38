/**
 * Command-line parsing shared by the commands: @std/cli's parseArgs, except that a flag which
 * takes a value takes the next argument even when it starts with one dash. parseArgs alone
 * reads `--temperature -1` as `--temperature` with no value followed by a flag `-1`
 * ("Unknown argument(s): --1"); a negative number must instead reach validation, which
 * refuses it by name and value.
 */
import { parseArgs } from "@std/cli/parse-args";

export interface FlagSpec {
  /** Flags that take a value. */
  readonly string: readonly string[];
  /** Flags without a value. */
  readonly boolean?: readonly string[];
  /** Value flags that may be repeated (collected into arrays). */
  readonly collect?: readonly string[];
}

export interface ParsedFlags {
  readonly values: Record<string, unknown>;
  /** Flags and positional arguments that the spec does not know, as typed. */
  readonly unknown: string[];
}

/** Parses `argv` by `spec`; never throws (the caller reports `unknown`). */
export function parseFlags(argv: readonly string[], spec: FlagSpec): ParsedFlags {
  const takesValue = new Set(spec.string);
  const joined: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const next = argv[i + 1];
    if (
      a.startsWith("--") && !a.includes("=") && takesValue.has(a.slice(2)) &&
      next !== undefined && next.startsWith("-") && !next.startsWith("--")
    ) {
      joined.push(`${a}=${next}`);
      i++;
    } else {
      joined.push(a);
    }
  }
  const flags = parseArgs(joined, {
    string: [...spec.string],
    boolean: [...(spec.boolean ?? [])],
    collect: [...(spec.collect ?? [])],
  }) as Record<string, unknown> & { _: (string | number)[] };
  const known = new Set([...spec.string, ...(spec.boolean ?? [])]);
  const unknown = [
    ...Object.keys(flags).filter((k) => k !== "_" && !known.has(k)).map((k) => `--${k}`),
    // parseArgs lists the value of `--prompt ""` as a positional too; an empty one is harmless.
    ...flags._.map(String).filter((a) => a !== ""),
  ];
  const values: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(flags)) if (k !== "_") values[k] = v;
  return { values, unknown };
}
