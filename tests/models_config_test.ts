/**
 * `--models-config`: a server of several models, each with its own settings, read through the
 * flags' table; checked on real CPU servers against the same requests with the settings spelled
 * out, and the file's mistakes named one by one.
 */
import { assertEquals, assertStringIncludes, assertThrows } from "@std/assert";
import { readModelsConfig } from "../lib/cli/models_config.ts";
import { compatPath } from "./harness/compat.ts";
import { spawnCpuServer } from "./_serve_child.ts";

async function writeConfig(text: string, ext = "yaml"): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "models_config_test_" });
  const path = `${dir}/models.${ext}`;
  await Deno.writeTextFile(path, text);
  return path;
}

Deno.test("readModelsConfig() reads each setting as its flag would, YAML or JSON", async () => {
  const yaml = await writeConfig(`models:
  small:
    model: stories260K
    aliases: [tiny, story]
    context-length: 256
    kv-memory: 2MiB
    keep-alive: 10m
    sampling: { temperature: 0, top_k: 5 }
`);
  const [e] = readModelsConfig(yaml);
  assertEquals(e, {
    name: "small",
    model: "stories260K",
    aliases: ["tiny", "story"],
    // 2 MiB and 10 minutes, as --kv-memory 2MiB and --keep-alive 10m give them.
    settings: { contextLength: 256, kvMemory: 2 * 2 ** 20, keepAlive: 600_000 },
    sampling: { temperature: 0, topK: 5 },
  });
  const json = await writeConfig(
    JSON.stringify({ models: { small: { model: "x.gguf", "kv-dtype": "f32" } } }),
    "json",
  );
  assertEquals(readModelsConfig(json)[0]!.settings, { kvDtype: "f32" });
});

Deno.test("readModelsConfig() names every mistake of the file with what it received", async () => {
  const bad = await writeConfig(`models:
  a:
    model: x.gguf
    context-length: -5
    keep-alive: soon
  b:
    model: y.gguf
    sampling: { temperature: 3 }
    threads: 4
`);
  const e = assertThrows(() => readModelsConfig(bad), Error);
  assertStringIncludes(e.message, `--models-config ${bad}:`);
  // Settings no model may have are refused by name, as are values out of a field's range.
  assertStringIncludes(e.message, "models.b");
  assertStringIncludes(e.message, "threads");
  assertStringIncludes(e.message, "models.b.sampling.temperature");
  const values = await writeConfig(`models:
  a:
    model: x.gguf
    context-length: -5
    keep-alive: soon
`);
  const v = assertThrows(() => readModelsConfig(values), Error);
  assertStringIncludes(v.message, "models.a.context-length: must be positive (received -5)");
  assertStringIncludes(v.message, "models.a.keep-alive:");
  assertStringIncludes(v.message, '(received "soon")');
  assertThrows(() => readModelsConfig(`${bad}.missing`), Error, "cannot read it");
  const empty = await writeConfig("models: {}");
  assertThrows(() => readModelsConfig(empty), Error, "names no model");
});

Deno.test("a server of several models from --models-config: each model's context, aliases, sampling defaults and keep-alive", async () => {
  const config = await writeConfig(`models:
  small:
    model: ${compatPath("stories260K-q4_1")}
    aliases: [tiny]
    context-length: 256
    sampling: { temperature: 0 }
  other:
    model: ${compatPath("stories260K-q5_1")}
    keep-alive: 0
`);
  const server = await spawnCpuServer(["--models-config", config]);
  const post = async (body: Record<string, unknown>) => {
    const res = await fetch(`${server.base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "Once upon a time", max_tokens: 12, ...body }),
    });
    const json = await res.json();
    assertEquals(res.status, 200, JSON.stringify(json));
    return json.choices[0].text as string;
  };
  try {
    const models = await (await fetch(`${server.base}/v1/models`)).json();
    // An alias is listed as a model of its own, as --served-model-name's are.
    assertEquals(models.data.map((m: { id: string }) => m.id), ["small", "tiny", "other"]);
    // small's default temperature is 0: a request naming none is the greedy one...
    const greedy = await post({ model: "small", temperature: 0 });
    assertEquals(await post({ model: "small" }), greedy);
    // ...by its alias too; and a request's own temperature still wins (a seed makes it exact).
    assertEquals(await post({ model: "tiny" }), greedy);
    const props = await (await fetch(`${server.base}/props?model=small`)).json();
    assertEquals([props.context_length, props.default_generation_settings.params.temperature], [
      256,
      0,
    ]);
    // other keeps the server's defaults, and its keep-alive of 0 unloads it after its request.
    await post({ model: "other", temperature: 0 });
    const otherProps = await (await fetch(`${server.base}/props?model=other`)).json();
    assertEquals(otherProps.default_generation_settings.params.temperature, 1);
    for (let i = 0; i < 100; i++) {
      const h = (await (await fetch(`${server.base}/health`)).json()).models;
      if (h.other.phase === "unloaded" && h.small.phase === "loaded") break;
      if (i === 99) throw new Error(`other was not unloaded: ${JSON.stringify(h)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  } finally {
    server.child.kill("SIGTERM");
    await server.child.status;
  }
});
