/**
 * Command-line parsing shared by the commands: @std/cli's parseArgs, except that a flag which
 * takes a value takes the next argument even when it starts with one dash. parseArgs alone
 * reads `--temperature -1` as `--temperature` with no value followed by a flag `-1`
 * ("Unknown argument(s): --1"); a negative number must instead reach validation, which
 * refuses it by name and value.
 *
 * Aliases let the names other tools use reach the same flag: llama.cpp's short flags (`-m`,
 * `-p`, `-c`, `-n`) and long spellings (`--ctx-size`, `--n-predict`). A user who typed one
 * sees it in error messages as typed.
 */
import { parseArgs } from "@std/cli/parse-args";

export interface FlagSpec {
  /** Flags that take a value. */
  readonly string: readonly string[];
  /** Flags without a value. */
  readonly boolean?: readonly string[];
  /** Value flags that may be repeated (collected into arrays). */
  readonly collect?: readonly string[];
  /** Other names for flags, without dashes: `{ m: "model", "ctx-size": "context-length" }`. */
  readonly aliases?: Readonly<Record<string, string>>;
}

export interface ParsedFlags {
  readonly values: Record<string, unknown>;
  /** Flags and positional arguments that the spec does not know, as typed. */
  readonly unknown: string[];
  /** Each flag given, by its name, as the user typed it (`n-gpu-layers` -> `-ngl`). */
  readonly typed: Record<string, string>;
}

/** Marks a several-letter flag typed after one dash, so that errors show it as typed. */
const SINGLE_DASH = "\u0000";

/** Parses `argv` by `spec`; never throws (the caller reports `unknown`). */
export function parseFlags(argv: readonly string[], spec: FlagSpec): ParsedFlags {
  const takesValue = new Set(spec.string);
  const joined: string[] = [];
  const typed: Record<string, string> = {};
  const canonical = canonicalArgs(argv, spec.aliases ?? {}, takesValue, typed);
  for (let i = 0; i < canonical.length; i++) {
    const a = canonical[i]!;
    const next = canonical[i + 1];
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
    // parseArgs reads `-x` as the key "x": show it with the one dash it was typed with.
    ...Object.keys(flags).filter((k) => k !== "_" && !known.has(k)).map((k) =>
      k.startsWith(SINGLE_DASH)
        ? `-${k.slice(SINGLE_DASH.length)}`
        : k.length === 1
        ? `-${k}`
        : `--${k}`
    ),
    // parseArgs lists the value of `--prompt ""` as a positional too; an empty one is harmless.
    ...flags._.map(String).filter((a) => a !== ""),
  ];
  const values: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(flags)) if (k !== "_") values[k] = v;
  return { values, unknown, typed };
}

/**
 * `argv` with every alias spelled as its flag (`-m x` as `--model x`, `-c=8` as
 * `--context-length=8`); a flag's value (`--prompt -m`) and arguments after `--` are left alone.
 */
function canonicalArgs(
  argv: readonly string[],
  aliases: Readonly<Record<string, string>>,
  takesValue: ReadonlySet<string>,
  typed: Record<string, string>,
): string[] {
  const out: string[] = [];
  let rest = false;
  for (const a of argv) {
    const prev = out.at(-1);
    const isValue = prev !== undefined && prev.startsWith("--") && takesValue.has(prev.slice(2));
    if (rest || a === "--" || isValue) {
      if (a === "--" && !isValue) rest = true;
      out.push(a);
      continue;
    }
    const m = /^--?([^=-][^=]*)(=.*)?$/.exec(a);
    const name = m?.[1];
    // A number after one dash stays a (negative) value: `-1`, `-0.5`, `-1e5`.
    if (name === undefined || /^[\d.]/.test(name)) {
      out.push(a);
      continue;
    }
    const target = aliases[name];
    typed[target ?? name] ??= a.split("=")[0]!;
    if (target !== undefined) out.push(`--${target}${m?.[2] ?? ""}`);
    // One dash and several letters is one flag (llama.cpp's `-ngl 99`), never `-n -g -l`.
    else if (!a.startsWith("--") && name.length > 1) {
      out.push(`--${SINGLE_DASH}${name}${m?.[2] ?? ""}`);
    } else out.push(a);
  }
  return out;
}
