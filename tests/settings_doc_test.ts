/**
 * docs/settings.md documents every flag of every command: checked against what the parser
 * takes (flag_parser.ts), not only against the table the page is written from.
 */
import { assert, assertEquals } from "@std/assert";
import { SETTINGS_DOC_PATH, settingsMarkdown } from "../lib/cli/settings_doc.ts";
import { commandAliases, commandSettings, parseSettings } from "../lib/cli/flag_parser.ts";
import { COMMAND_NAMES, type CommandName } from "../lib/cli/commands.ts";
import { flagOf, row } from "../lib/cli/settings.ts";

const page = Deno.readTextFileSync(new URL(`../${SETTINGS_DOC_PATH}`, import.meta.url));

/** deno fmt aligns the tables and rewraps the prose: compare the words. */
const words = (s: string) => s.replace(/-{3,}/g, "---").replace(/\s+/g, " ").trim();

interface DocRow {
  readonly also: string[];
  readonly variable: string;
  readonly commands: string[];
}

/** The page's flag tables, by the flag each row documents (`--model`, `--model repeated`). */
function docRows(): Map<string, DocRow> {
  const out = new Map<string, DocRow>();
  for (const line of page.split("\n")) {
    const cells = line.split(/(?<!\\)\|/).slice(1, -1).map((c) => c.trim());
    if (cells.length !== 6 || !cells[0]!.startsWith("`--")) continue;
    const ticks = (c: string) => [...c.matchAll(/`([^`]+)`/g)].map((m) => m[1]!);
    out.set(cells[0]!.replaceAll("`", ""), {
      also: ticks(cells[1]!),
      variable: ticks(cells[2]!)[0] ?? "",
      commands: cells[4]!.split(",").map((c) => c.trim()),
    });
  }
  return out;
}

/** Whether `command`'s parser knows `argv[0]` (a bad or missing value is still known). */
function takes(command: CommandName, argv: string[]): boolean {
  try {
    parseSettings(command, argv, () => undefined);
    return true;
  } catch (e) {
    return !(e as Error).message.startsWith("Unknown argument");
  }
}

Deno.test("docs/settings.md is the page `deno task docs:settings` writes from the settings table", () => {
  assert(
    words(page) === words(settingsMarkdown()),
    `${SETTINGS_DOC_PATH} differs from the settings table: run \`deno task docs:settings\``,
  );
});

Deno.test("every flag each command parses is in docs/settings.md with its other spellings and its variable", () => {
  const rows = docRows();
  let checked = 0;
  for (const command of COMMAND_NAMES) {
    const aliases = commandAliases(command);
    for (const name of commandSettings(command)) {
      const flag = `--${flagOf(name)}`;
      assert(takes(command, [flag]), `${command} takes ${flag}`);
      const doc = rows.get(flag);
      if (doc === undefined) {
        throw new Error(`${flag} (${command}) is missing from ${SETTINGS_DOC_PATH}`);
      }
      assert(doc.commands.includes(command), `${flag}: the page does not name ${command}`);
      assertEquals(doc.variable, row(name).env ?? "", `${flag}'s variable`);
      const spellings = Object.entries(aliases).filter(([, f]) => f === flagOf(name));
      for (const [alias] of spellings) {
        assert(
          doc.also.some((s) => s.replace(/^-+/, "") === alias),
          `${flag}: the page lacks its spelling ${alias}`,
        );
      }
      checked++;
    }
  }
  // serve's flags alone are more than 50: a page or a parser that lost its rows fails here.
  assert(checked > 80, `checked ${checked} flags`);
});

Deno.test("every flag docs/settings.md documents is parsed by each command it names, and by no other", () => {
  const rows = docRows();
  assert(rows.size > 60, `${rows.size} rows`);
  for (const [flag, doc] of rows) {
    // `--model repeated` is documented by --model's row as well.
    if (flag.includes(" ")) continue;
    for (const command of COMMAND_NAMES) {
      assertEquals(
        takes(command, [flag]),
        doc.commands.includes(command),
        `${command} ${flag}: the page says ${doc.commands.join(", ")}`,
      );
      for (const spelling of doc.also) {
        if (doc.commands.includes(command)) {
          assert(takes(command, [spelling]), `${command} takes ${spelling} (for ${flag})`);
        }
      }
    }
  }
});
