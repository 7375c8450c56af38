import { assertEquals, assertGreater } from "@std/assert";
import { collectEdges, layerViolations } from "../bench/import_graph.ts";

const root = new URL("..", import.meta.url).pathname.replace(/\/$/, "");

Deno.test("source folders import only from lower layers", () => {
  const edges = collectEdges(root);
  assertGreater(edges.length, 100, "the import scan found almost nothing: is the regex broken?");
  assertEquals(layerViolations(edges), []);
});

Deno.test("a back-edge and an unlisted folder are both reported", () => {
  const problems = layerViolations([
    { from: "lib/util", to: "actors", file: "lib/util/x.ts", specifier: "../../actors/core.ts" },
    { from: "lib/new_thing", to: "lib/util", file: "lib/new_thing/y.ts", specifier: "../util/z.ts" },
    { from: "actors", to: "lib/core", file: "actors/ok.ts", specifier: "../lib/core/a.ts" },
  ]);
  assertEquals(problems.length, 2);
  assertEquals(problems[0]!.startsWith('lib/util/x.ts imports "../../actors/core.ts"'), true);
  assertEquals(problems[1]!.includes("lib/new_thing is not in LAYERS"), true);
});
