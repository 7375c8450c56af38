/**
 * Each command's `--help` is written from the settings table: it lists exactly the flags the
 * command's parser takes, and the default it shows is the value a run gets without the flag.
 */
import { assert, assertEquals } from "@std/assert";
import { helpText } from "../lib/cli/help.ts";
import { parseSettings } from "../lib/cli/flag_parser.ts";
import { COMMAND_NAMES, type CommandName } from "../lib/cli/commands.ts";
import { flagOf, SETTING_NAMES, type SettingName, type Settings } from "../lib/cli/settings.ts";

const noEnv = () => undefined;

interface HelpRow {
  readonly flag: string;
  readonly spellings: string[];
  readonly shownDefault?: string;
}

/** The flag rows of a help text: `  --flag  what it does [-x, --y; env V; default D]`. */
function helpRows(text: string): HelpRow[] {
  const rows: HelpRow[] = [];
  for (const line of text.split("\n")) {
    const m = /^ {2}(--[a-z-]+) {2,}.*?(?:\[([^\]]*)\])?$/.exec(line);
    if (m === null) continue;
    const facts = (m[2] ?? "").split("; ");
    rows.push({
      flag: m[1]!,
      spellings: facts.filter((f) => f.startsWith("-")).flatMap((f) => f.split(", ")),
      shownDefault: facts.find((f) => f.startsWith("default "))?.slice("default ".length),
    });
  }
  return rows;
}

function settingOf(flag: string): SettingName {
  return SETTING_NAMES.find((n) => `--${flagOf(n)}` === flag)!;
}

function parses(command: CommandName, argv: string[]): Settings | Error {
  try {
    return parseSettings(command, argv, noEnv);
  } catch (e) {
    return e as Error;
  }
}

Deno.test("every command's --help lists each flag its parser takes, and only those", () => {
  for (const command of COMMAND_NAMES) {
    const rows = helpRows(helpText(command));
    const listed = new Set(rows.map((r) => r.flag));
    for (const flag of ["--help", "--version"]) assert(listed.has(flag), `${command} ${flag}`);
    for (const name of SETTING_NAMES) {
      const flag = `--${flagOf(name)}`;
      const r = parses(command, [flag]);
      const known = !(r instanceof Error && r.message.startsWith("Unknown argument"));
      assertEquals(listed.has(flag), known, `${command} --help and its parser on ${flag}`);
    }
  }
});

Deno.test("the default --help shows is what a run without the flag gets, by every spelling", () => {
  let checked = 0;
  for (const command of COMMAND_NAMES) {
    const none = parses(command, []);
    if (none instanceof Error) throw none;
    for (const row of helpRows(helpText(command))) {
      if (row.shownDefault === undefined || row.flag === "--help") continue;
      const name = settingOf(row.flag);
      // A switch's default is its absence; the flag alone turns it on.
      const argv = (spelling: string) =>
        typeof none[name] === "boolean" ? [`${spelling}=${row.shownDefault}`] : [
          spelling,
          row.shownDefault!,
        ];
      for (const spelling of [row.flag, ...row.spellings]) {
        const given = parses(command, argv(spelling));
        if (given instanceof Error) throw new Error(`${command} ${spelling}: ${given.message}`);
        assertEquals(given[name], none[name], `${command} ${spelling} ${row.shownDefault}`);
        checked++;
      }
    }
  }
  assert(checked > 60, `checked ${checked}`);
});
