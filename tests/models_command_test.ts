import { assertEquals, assertStringIncludes } from "@std/assert";
import { modelFile } from "./harness/model_files.ts";

const ROOT = new URL("..", import.meta.url).pathname;

Deno.test("deno task models lists both places with size, format, architecture and quantization", async () => {
  const modelsDir = await Deno.makeTempDir({ prefix: "models_command_test_" });
  try {
    await Deno.copyFile(modelFile("stories260K-q8_0.gguf"), `${modelsDir}/mine-q8.gguf`);
    // Links into a shared store are listed like the files they point to.
    for (const name of ["qwen2-like-q4_k_m", "tinyllama-like-q5_k_m"]) {
      await Deno.symlink(
        await Deno.realPath(modelFile(`compat/${name}.gguf`)),
        `${modelsDir}/${name}.gguf`,
      );
    }
    await Deno.writeFile(`${modelsDir}/broken.gguf`, new TextEncoder().encode("GGUF\x03\0\0\0"));
    await Deno.writeTextFile(`${modelsDir}/half.gguf.part`, "x");
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["task", "models"],
      cwd: ROOT,
      env: { MODELS_DIR: modelsDir },
      stdin: "null",
    }).output();
    const text = new TextDecoder().decode(out.stdout);
    assertEquals(out.code, 0, new TextDecoder().decode(out.stderr));
    assertStringIncludes(text, `models directory: ${modelsDir}`);
    const rows = new Map(
      text.split("\n").map((l) => l.trim().split(/\s{2,}/)).map((cols) => [cols[0], cols.slice(1)]),
    );
    // Quantizations as ../shared/models/README.md describes the files llama.cpp made: Q8_0 with
    // the ffn_down tensors in F16 and the norms in F32; the converted GGUF all F32.
    assertEquals(rows.get("mine-q8"), [
      "models dir",
      "370.3 KiB",
      "GGUF",
      "llama",
      "Q8_0 (+F16, F32)",
    ]);
    assertEquals(rows.get("stories260K-q8_0")?.slice(0, 1), ["mirror"]);
    // A K-quant mix is named as llama-quantize made it (the file's name says which), though most
    // of its weights are another type.
    for (
      const [name, type] of [["qwen2-like-q4_k_m", "Q4_K_M"], ["tinyllama-like-q5_k_m", "Q5_K_M"]]
    ) {
      const quant = rows.get(name)?.[4] ?? "(not listed)";
      assertEquals(quant.split(" ")[0], type, quant);
    }
    assertEquals(rows.get("stories260K.gguf")?.slice(2), ["GGUF", "llama", "F32"]);
    assertEquals(rows.get("stories260K.bin")?.slice(2), ["llama2.c", "llama", "F32"]);
    assertEquals(rows.get("tok512.bin")?.[2], "tokenizer");
    assertEquals(rows.get("broken")?.[2], "GGUF");
    assertStringIncludes(rows.get("broken")?.[3] ?? "", "unreadable");
    // A download in progress is not a model.
    assertEquals(text.includes("half"), false, text);
  } finally {
    await Deno.remove(modelsDir, { recursive: true });
  }
});
