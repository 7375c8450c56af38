/**
 * docs/settings.md, written from the settings table (settings.ts) and the commands
 * (commands.ts): one table of flags per group, the `--models-config` keys and the peers'
 * flags. `deno task docs:settings` rewrites the page; tests/settings_doc_test.ts fails while
 * the page and the table differ, so a flag added to the table is documented or the suite fails.
 *
 * @example
 * ```ts
 * import { assertStringIncludes } from "@std/assert";
 *
 * const page = settingsMarkdown();
 * assertStringIncludes(page, "| `--drain-timeout` |");
 * assertStringIncludes(page, "`LLMSERVE_DRAIN_TIMEOUT`");
 * ```
 */
import { COMMAND_NAMES, COMMANDS } from "./commands.ts";
import { spelled } from "./help.ts";
import {
  flagOf,
  givingFlag,
  PEER_FLAG_COMMANDS,
  PEER_FLAGS,
  row,
  SETTING_NAMES,
  type SettingName,
} from "./settings.ts";

/** Where the page lives, from the repository's root. */
export const SETTINGS_DOC_PATH = "docs/settings.md";

/** Text in a table cell: a `|` would end the cell. */
function cell(s: string): string {
  return s.replaceAll("|", "\\|");
}

const code = (s: string) => `\`${s}\``;

/** The flag column: the setting's own flag, or the one whose repeats fill it. */
function flagCell(name: SettingName): string {
  const given = givingFlag(name);
  if (given === undefined) return "(variable only)";
  return given.repeated ? `${code(given.flag)} repeated` : code(given.flag);
}

/** What a setting does, with what it means for a command where that differs. */
function helpCell(name: SettingName): string {
  const r = row(name);
  const narrower = Object.entries(r.helpFor ?? {}).map(([c, h]) => ` ${c}: ${h}.`);
  const kind = r.kind === "switch"
    ? " A switch: the flag alone, or its variable set to true, false, 1 or 0."
    : "";
  return cell(`${r.help}.${narrower.join("")}${kind}`);
}

function settingRow(name: SettingName): string {
  const r = row(name);
  const also = (r.aliases ?? []).map((a) => code(spelled(a))).join(", ");
  const env = r.env === undefined ? "" : code(r.env);
  const dflt = r.default === undefined || r.default === "" ? "" : code(String(r.default));
  return `| ${
    [flagCell(name), also, env, dflt, r.commands.join(", "), helpCell(name)].join(" | ")
  } |`;
}

/** The groups of the table, in its order. */
function groups(): Map<string, SettingName[]> {
  const out = new Map<string, SettingName[]>();
  for (const n of SETTING_NAMES) {
    const g = row(n).group;
    out.set(g, [...(out.get(g) ?? []), n]);
  }
  return out;
}

/** The whole page. */
export function settingsMarkdown(): string {
  const reading = COMMAND_NAMES.filter((c) => COMMANDS[c].environment);
  const lines = [
    "# Settings",
    "",
    "Every flag of every command. This page is written from the settings table",
    "(`lib/cli/settings.ts`) by `deno task docs:settings`, and the test suite fails while the",
    "two differ; each command's `--help` is written from the same table.",
    "",
    "A flag wins over its environment variable, which wins over the default.",
    `${reading.map((c) => code(c)).join(" and ")} read the variables; the others read flags only.`,
    "A list setting takes its flag repeated, or its variable comma-separated. A value is checked",
    "the same way wherever it comes from, and an invalid one stops the start naming the flag (or",
    "the variable) and the value received, e.g.",
    '`--drain-timeout: must be 0 or more seconds (received "-1")`.',
    "",
    "## Commands",
    "",
    "| Command | Started by | What it does |",
    "| --- | --- | --- |",
    ...COMMAND_NAMES.map((c) =>
      `| ${c} | ${code(`${COMMANDS[c].task} ${COMMANDS[c].usage}`)} | ${
        cell(COMMANDS[c].summary)
      } |`
    ),
    "",
    "Every command also takes `--help` (its flags, from the table) and `--version`.",
  ];
  for (const [group, names] of groups()) {
    lines.push(
      "",
      `## ${group}`,
      "",
      "| Flag | Also | Variable | Default | Commands | What it does |",
      "| --- | --- | --- | --- | --- | --- |",
      ...names.map(settingRow),
    );
  }
  const perModel = SETTING_NAMES.filter((n) => row(n).perModel);
  lines.push(
    "",
    "## Per model, in a --models-config file",
    "",
    "A model's entry in the `--models-config` file may set these, under the flag's name and",
    "with the flag's values; they replace the server's for that model:",
    perModel.map((n) => code(flagOf(n))).join(", ") + ".",
    "",
    "## Flags of other servers",
    "",
    `${
      PEER_FLAG_COMMANDS.map((c) => code(c)).join(" and ")
    } answer these llama-server and vLLM flags with what does that job here:`,
    "",
    "| Flag | Here instead |",
    "| --- | --- |",
    ...Object.entries(PEER_FLAGS).map(([flag, p]) =>
      `| ${[flag, ...(p.aliases ?? [])].map((f) => code(spelled(f))).join(", ")} | ${
        cell(p.instead)
      } |`
    ),
    "",
  );
  return lines.join("\n");
}

if (import.meta.main) {
  const root = new URL("../../", import.meta.url);
  Deno.writeTextFileSync(new URL(SETTINGS_DOC_PATH, root), settingsMarkdown());
  console.error(`wrote ${SETTINGS_DOC_PATH}`);
}
