import { assertEquals, assertMatch } from "@std/assert";
import { identityOrWarning, modelIdentity } from "../lib/cluster/model_identity.ts";
import { modelFile } from "./harness/model_files.ts";

Deno.test("a model file that cannot be read again is served without an identity, and the log says why", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/gone.gguf`;
    await Deno.copyFile(modelFile("stories260K.gguf"), path);
    const lines: string[] = [];
    const id = await identityOrWarning(path, 512, (l) => lines.push(l));
    assertEquals(id, await modelIdentity(path, 512));
    assertEquals(lines, [], "nothing to say while the file is there");
    await Deno.remove(path);
    assertEquals(await identityOrWarning(path, 512, (l) => lines.push(l)), undefined);
    assertEquals(lines.length, 1);
    assertMatch(
      lines[0]!,
      new RegExp(
        `^warning: cannot read ${path} again for its identity \\(No such file or directory.*\\); ` +
          "routers will match this model by its name alone$",
      ),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a model's identity tells its size, its first 64 KiB and its context apart", async () => {
  const path = modelFile("stories260K.gguf");
  const size = (await Deno.stat(path)).size;
  const id = await modelIdentity(path, 512);
  assertMatch(id, new RegExp(`^${size}-[0-9a-f]{16}-ctx512$`));
  assertEquals(id === await modelIdentity(path, 128), false, "the context is part of it");
});
