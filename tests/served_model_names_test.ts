/** `--served-model-name alias=model` in a server of several models: names and clear errors. */
import { assertEquals, assertThrows } from "@std/assert";
import { withServedNames } from "../lib/cli/serve_models.ts";

const catalog = [{ name: "stories260K-q4_1", path: "/a" }, {
  name: "tinyllama-like-q4_0",
  path: "/b",
}];

Deno.test("alias=model serves the model by the alias (the first given is its name), and by further ones", () => {
  assertEquals(withServedNames(catalog, []), catalog);
  const named = withServedNames(catalog, [
    "story=stories260K-q4_1",
    "tale=stories260K-q4_1",
    " chat = tinyllama-like-q4_0",
  ]);
  assertEquals(named, [
    { name: "story", path: "/a", aliases: ["tale"] },
    { name: "chat", path: "/b", aliases: [] },
  ]);
  // A model keeps its file's name only when no alias is given for it.
  assertEquals(withServedNames(catalog, ["story=stories260K-q4_1"])[1], catalog[1]);
});

Deno.test("--served-model-name with several models: each mistake is named with what was received", () => {
  const fails = (entries: string[], message: string) =>
    assertThrows(() => withServedNames(catalog, entries), Error, message);
  fails(
    ["story"],
    'each name says which model it is for, as alias=model (model: one of "stories260K-q4_1", "tinyllama-like-q4_0"); received "story"',
  );
  fails(["=stories260K-q4_1"], 'the alias before "=" is empty in "=stories260K-q4_1"');
  fails(
    ["story=stories"],
    'no model is named "stories"; the models are "stories260K-q4_1", "tinyllama-like-q4_0"',
  );
  fails(
    ["x=stories260K-q4_1", "x=tinyllama-like-q4_0"],
    'two models would be served as "x": "stories260K-q4_1" and "tinyllama-like-q4_0"',
  );
  fails(
    ["tinyllama-like-q4_0=stories260K-q4_1"],
    'two models would be served as "tinyllama-like-q4_0"',
  );
});
