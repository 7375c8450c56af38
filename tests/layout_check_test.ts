import { assertEquals, assertGreater, assertStringIncludes } from "@std/assert";
import { collectEdges, LAYERS, layerViolations } from "../.ci/layout_check.ts";

const root = new URL("..", import.meta.url).pathname.replace(/\/$/, "");

Deno.test("every folder, tests/ and bench/ too, imports only from lower layers", () => {
  const edges = collectEdges(root);
  assertGreater(edges.length, 100, "the import scan found almost nothing: is the regex broken?");
  // The scan reaches the tests, the benchmarks and the harness they share, not only the source.
  for (const folder of ["tests", "bench", "tests/harness", ".ci"]) {
    assertEquals(edges.some((e) => e.from === folder), true, `no import scanned from ${folder}`);
  }
  assertEquals(layerViolations(edges), []);
});

Deno.test("the shared harness sits below both the tests and the benchmarks", () => {
  const rank = (folder: string) => LAYERS.indexOf(folder);
  assertGreater(rank("tests/harness"), rank("lib/cli"));
  assertGreater(rank("bench"), rank("tests/harness"));
  assertGreater(rank("tests"), rank("bench"));
});

Deno.test("a back-edge and an unlisted folder are both reported", () => {
  const problems = layerViolations([
    { from: "lib/util", to: "actors", file: "lib/util/x.ts", specifier: "../../actors/core.ts" },
    {
      from: "lib/new_thing",
      to: "lib/util",
      file: "lib/new_thing/y.ts",
      specifier: "../util/z.ts",
    },
    { from: "actors", to: "lib/core", file: "actors/ok.ts", specifier: "../lib/core/a.ts" },
  ]);
  assertEquals(problems.length, 2);
  assertEquals(problems[0]!.startsWith('lib/util/x.ts imports "../../actors/core.ts"'), true);
  assertEquals(problems[1]!.includes("lib/new_thing is not in LAYERS"), true);
});

/** A tree with the tests ⇄ bench cycle this check exists to catch, and one allowed edge each. */
async function treeWithBackEdges(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "layout_check_test_" });
  const files: Record<string, string> = {
    "lib/util/a.ts": "export const a = 1;\n",
    "tests/harness/fake.ts": 'import { a } from "../../lib/util/a.ts";\nexport const f = a;\n',
    // Back-edge: a benchmark importing a test file.
    "bench/b.ts": 'import { t } from "../tests/t_test.ts";\nexport const b = t;\n',
    // Back-edge, as a side-effect import: the harness importing the benchmarks.
    "tests/harness/h.ts": 'import "../../bench/b.ts";\n',
    // Allowed: a test of a benchmark, a benchmark on the harness.
    "tests/t_test.ts": 'export { b } from "../bench/b.ts";\nexport const t = 1;\n',
    "bench/c.ts": 'export { f } from "../tests/harness/fake.ts";\n',
  };
  for (const [path, text] of Object.entries(files)) {
    await Deno.mkdir(`${dir}/${path.slice(0, path.lastIndexOf("/"))}`, { recursive: true });
    await Deno.writeTextFile(`${dir}/${path}`, text);
  }
  return dir;
}

Deno.test("a synthetic tree with a tests/bench back-edge fails the check", async () => {
  const dir = await treeWithBackEdges();
  try {
    const edges = collectEdges(dir);
    assertEquals(edges.length, 5);
    const problems = layerViolations(edges);
    assertEquals(problems.length, 2, problems.join("\n"));
    assertEquals(
      problems.some((p) => p.startsWith('bench/b.ts imports "../tests/t_test.ts"')),
      true,
    );
    assertEquals(
      problems.some((p) => p.startsWith('tests/harness/h.ts imports "../../bench/b.ts"')),
      true,
    );

    // And `deno task layout`'s command exits 1 on it, naming the back-edge.
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--allow-read",
        new URL("../.ci/layout_check.ts", import.meta.url).pathname,
        dir,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    assertEquals(out.code, 1);
    assertStringIncludes(new TextDecoder().decode(out.stderr), "2 layering problem(s)");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
