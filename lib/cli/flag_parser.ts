/**
 * The one flag parser: a command's flags, aliases and peer spellings come from the settings
 * table (settings.ts), and so do the environment variables and the defaults behind them. Every
 * command parses through here, so a flag means the same and fails the same way everywhere.
 */
import { parseFlags } from "./args.ts";
import { peerFlagError, unknownArgumentsError } from "./flag_suggestions.ts";
import { type CommandName, COMMANDS } from "./commands.ts";
import {
  flagOf,
  givingFlag,
  peerFlagsOf,
  row,
  SETTING_NAMES,
  type SettingName,
  type Settings,
} from "./settings.ts";

export type Env = (name: string) => string | undefined;

const processEnv: Env = (n) => Deno.env.get(n);

/** The settings `command` takes as flags, in the table's order. */
export function commandSettings(command: CommandName): SettingName[] {
  return SETTING_NAMES.filter((n) => row(n).commands.includes(command) && !row(n).noFlag);
}

/** Each alias of `command`'s flags (and of the peers' flags it answers), to its flag. */
export function commandAliases(command: CommandName): Record<string, string> {
  const out: Record<string, string> = {};
  for (const n of commandSettings(command)) {
    for (const a of row(n).aliases ?? []) out[a] = flagOf(n);
  }
  for (const [flag, p] of peerFlagsOf(command)) {
    for (const a of p.aliases ?? []) out[a] = flag;
  }
  return out;
}

/**
 * Parses `command`'s flags into the validated settings: flags win over the environment (for
 * a command that reads it), which wins over the table's defaults. Throws an Error naming an
 * unknown flag (with the nearest known one), a peer's flag (with what to use instead), or
 * every invalid value with where it came from and what was received.
 */
export function parseSettings(
  command: CommandName,
  argv: readonly string[],
  env: Env = processEnv,
): Settings {
  return resolveSettings(command, flagValues(command, argv), env);
}

/**
 * Whether `name` given several times fills its list setting for `command` (serve's --model);
 * where the command has no such list (generate), the last one wins, as for any flag.
 */
function repeatsHere(command: CommandName, name: SettingName): boolean {
  const into = row(name).repeatsInto as SettingName | undefined;
  return into !== undefined && row(into).commands.includes(command);
}

/** The flags `argv` gives, by setting, as typed (not validated yet). */
export function flagValues(
  command: CommandName,
  argv: readonly string[],
): Partial<Record<SettingName, unknown>> {
  const names = commandSettings(command);
  const kind = (n: SettingName) => row(n).kind ?? "value";
  const peers = peerFlagsOf(command).map(([flag]) => flag);
  const aliases = commandAliases(command);
  const { values, unknown, typed } = parseFlags(argv, {
    string: [...names.filter((n) => kind(n) !== "switch").map(flagOf), ...peers],
    boolean: ["help", "version", ...names.filter((n) => kind(n) === "switch").map(flagOf)],
    collect: names.filter((n) => kind(n) === "list" || repeatsHere(command, n)).map(flagOf),
    aliases,
  });
  for (const flag of peers) {
    if (values[flag] !== undefined) {
      throw new Error(peerFlagError(flag, typed[flag] ?? `--${flag}`));
    }
  }
  if (unknown.length > 0) {
    const known = [
      ...names.map(flagOf),
      "help",
      "version",
      ...Object.keys(aliases).filter((a) => a.length > 2),
    ];
    throw new Error(unknownArgumentsError(unknown, known, COMMANDS[command].task));
  }
  const named: Partial<Record<SettingName, unknown>> = {};
  for (const n of names) {
    const flag = flagOf(n);
    const v = values[flag];
    // parseArgs reports an absent switch as false, which would hide the environment's.
    if (v === undefined || typed[flag] === undefined) continue;
    if (Array.isArray(v) && v.length === 0) continue;
    const into = row(n).repeatsInto as SettingName | undefined;
    if (into !== undefined && repeatsHere(command, n) && Array.isArray(v)) {
      // Given several times it fills the list (--model a --model b); once, as always.
      if (v.length > 1) named[into] = v;
      named[n] = v[0];
    } else named[n] = v;
  }
  return named;
}

/**
 * Validates every setting of the table for `command`: `named` holds its flags' values. A
 * setting the command does not take gets its default, so the result is always complete.
 */
export function resolveSettings(
  command: CommandName,
  named: Partial<Record<SettingName, unknown>>,
  env: Env = processEnv,
): Settings {
  const readsEnv = COMMANDS[command].environment;
  const out: Record<string, unknown> = {};
  const problems: string[] = [];
  for (const name of SETTING_NAMES) {
    const r = row(name);
    const takes = r.commands.includes(command);
    const list = r.kind === "list";
    const fromEnv = takes && readsEnv && r.env !== undefined ? env(r.env) : undefined;
    let raw: unknown;
    let where: string;
    if (takes && named[name] !== undefined) {
      raw = named[name];
      where = shownFlag(name);
    } else if (fromEnv !== undefined && fromEnv !== "") {
      raw = list ? fromEnv.split(",").map((s) => s.trim()).filter(Boolean) : fromEnv;
      where = r.noFlag ? r.env! : `${r.env} (${shownFlag(name)})`;
    } else {
      raw = r.default ?? (list ? [] : undefined);
      where = `the default of ${shownFlag(name)}`;
    }
    if (list && raw !== undefined && !Array.isArray(raw)) raw = [raw];
    const parsed = r.schema.safeParse(raw);
    if (parsed.success) out[name] = parsed.data;
    else problems.push(...parsed.error.issues.map((i) => problem(name, where, raw, i)));
  }
  if (problems.length > 0) throw new Error(`Invalid configuration:\n  ${problems.join("\n  ")}`);
  return out as Settings;
}

/** The flag a setting is given by: its own, or the one whose repeats fill it. */
function shownFlag(name: SettingName): string {
  return givingFlag(name)?.flag ?? name;
}

function problem(
  name: SettingName,
  where: string,
  raw: unknown,
  issue: { message: string; path: PropertyKey[] },
): string {
  const index = issue.path[0];
  // API keys are secrets: say which one, never echo it.
  if (name === "apiKey") return `${where} #${Number(index ?? 0) + 1}: ${issue.message}`;
  if (Array.isArray(raw) && typeof index === "number") {
    return `${where}: ${issue.message} (received ${JSON.stringify(raw[index])})`;
  }
  const received = JSON.stringify(raw);
  return issue.message.includes(String(received))
    ? `${where}: ${issue.message}`
    : `${where}: ${issue.message} (received ${received})`;
}
