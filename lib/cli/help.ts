/**
 * Every command's `--help`, written from the settings table: each flag the command takes, with
 * its other spellings, its variable and its default, then the peers' flags it answers, then the
 * command's examples (commands.ts). A flag added to the table is in `--help` at once.
 */
import { type CommandName, COMMANDS } from "./commands.ts";
import { commandSettings } from "./flag_parser.ts";
import { flagOf, peerFlagsOf, row, type SettingName } from "./settings.ts";
import { versionLine } from "./version.ts";

/** A spelling as typed: `-m`, `-ngl` (llama.cpp's short ones), `--ctx-size`. */
export function spelled(flag: string): string {
  return flag.length <= 3 && !flag.includes("-") ? `-${flag}` : `--${flag}`;
}

/** What --help says of a setting for `command`. */
export function helpOf(name: SettingName, command: CommandName): string {
  const r = row(name);
  return r.helpFor?.[command] ?? r.help;
}

/** `[-c, --ctx-size; env LLMSERVE_X; default 8]`: a flag's spellings, variable and default. */
function facts(name: SettingName, command: CommandName): string {
  const r = row(name);
  const parts = [
    ...(r.aliases?.length ? [r.aliases.map(spelled).join(", ")] : []),
    ...(r.env !== undefined && COMMANDS[command].environment ? [`env ${r.env}`] : []),
    ...(r.default !== undefined && r.default !== "" ? [`default ${r.default}`] : []),
  ];
  return parts.length === 0 ? "" : ` [${parts.join("; ")}]`;
}

/** The whole `--help` of `command`. */
export function helpText(command: CommandName): string {
  const c = COMMANDS[command];
  const names = commandSettings(command);
  const width = Math.max("--version".length, ...names.map((n) => flagOf(n).length + 2));
  const pad = (s: string) => `  ${s.padEnd(width)}  `;
  const rows = names.map((n) =>
    `${pad(`--${flagOf(n)}`)}${helpOf(n, command)}${facts(n, command)}`
  );
  const peerFlags = peerFlagsOf(command);
  const peers = peerFlags.length > 0
    ? [
      "Flags of other servers that do another job here:",
      ...peerFlags.map(([flag, p]) =>
        `  ${[flag, ...(p.aliases ?? [])].map(spelled).join(", ")}: ${p.instead}`
      ),
    ]
    : [];
  const exampleWidth = Math.max(...c.examples.map(([e, what]) => what === "" ? 0 : e.length));
  const examples = c.examples.map(([e, what]) =>
    what === "" ? `  ${e}` : `  ${e.padEnd(exampleWidth)}  ${what}`
  );
  return [
    `Usage: ${c.task} ${c.usage}`,
    ...("about" in c ? [c.about] : []),
    ...rows,
    `${pad("--help")}this text`,
    `${pad("--version")}print the version and exit`,
    ...peers,
    "",
    "Examples:",
    ...examples,
  ].join("\n");
}

/**
 * Prints `command`'s --help or --version when `argv` asks for one (before any other flag is
 * read, so that a bad one does not hide the help); returns whether it did.
 */
export function printInfo(command: CommandName, argv: readonly string[]): boolean {
  const text = infoText(command, argv);
  if (text !== undefined) console.log(text);
  return text !== undefined;
}

/** What `--help` or `--version` print, or undefined for a run. */
export function infoText(command: CommandName, argv: readonly string[]): string | undefined {
  if (argv.includes("--help")) return helpText(command);
  if (argv.includes("--version")) return versionLine();
  return undefined;
}
