import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { modelFile } from "./harness/model_files.ts";
import { runGenerate } from "./harness/generate_command.ts";
import { parseLlama2cTokenizer } from "../lib/tokenizer/llama2c_tokenizer.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";

/** A fixture's stdout without the prompt run.c echoes first: what `generate` must print. */
async function runCText(name: string, prompt: string): Promise<string> {
  const text = await Deno.readTextFile(new URL(`./fixtures/run_c/${name}.txt`, import.meta.url));
  assert(text.startsWith(prompt), `fixture ${name} should start with its prompt`);
  return text.slice(prompt.length);
}

/** run.c prints the prompt, then the continuation; the fixture was made with -n 256. */
async function runCContinuation(): Promise<string> {
  const text = await Deno.readTextFile(
    new URL("./fixtures/run_c/once_upon_a_time_n256.txt", import.meta.url),
  );
  assert(text.startsWith("Once upon a time"), "fixture should start with its prompt");
  return text.slice("Once upon a time".length);
}

for (const backend of ["cpu", "webgpu"]) {
  Deno.test(`generate on ${backend} prints run.c's greedy continuation token for token (llama2.c checkpoint)`, async () => {
    const r = await runGenerate([
      "--model",
      modelFile("stories260K.bin"),
      "--tokenizer",
      modelFile("tok512.bin"),
      "--prompt",
      "Once upon a time",
      "--max-tokens",
      "64",
      "--temperature",
      "0",
      "--backend",
      backend,
    ]);
    assertEquals(r.code, 0, r.stderr);
    const expected = await runCContinuation();
    assert(r.stdout.trimEnd().length > 100, `too little output: ${r.stdout}`);
    assert(
      expected.startsWith(r.stdout.trimEnd()),
      `CLI output diverges from run.c:\n${r.stdout}\nvs\n${expected}`,
    );
    assertStringIncludes(r.stderr, "64 tokens");
    assertStringIncludes(r.stderr, `on ${backend}`);
  });
}

Deno.test("generate gives run.c's greedy text from the llama.cpp-converted GGUF, exactly", async () => {
  // run.c -n 64 with this 4-token prompt computes 60 new tokens (fixtures/run_c/README.md).
  const r = await runGenerate([
    "--model",
    modelFile("stories260K-ctx512.gguf"),
    "--prompt",
    "Once upon a time",
    "--max-tokens",
    "60",
    "--temperature",
    "0",
    "--backend",
    "cpu",
  ]);
  assertEquals(r.code, 0, r.stderr);
  assertEquals(r.stdout, await runCText("once_upon_a_time_n64", "Once upon a time"));
});

Deno.test("generate with a seed is reproducible and differs from another seed", async () => {
  const args = [
    "--model",
    modelFile("stories260K.bin"),
    "--tokenizer",
    modelFile("tok512.bin"),
    "--prompt",
    "Tom had a dog",
    "--max-tokens",
    "40",
    "--temperature",
    "1",
    "--backend",
    "cpu",
  ];
  const [a, b, c] = await Promise.all([
    runGenerate([...args, "--seed", "7"]),
    runGenerate([...args, "--seed", "7"]),
    runGenerate([...args, "--seed", "8"]),
  ]);
  assertEquals(a.code, 0, a.stderr);
  assertEquals(a.stdout, b.stdout);
  assert(a.stdout !== c.stdout, "different seeds should give different text");
});

Deno.test("generate names a bad flag value and exits 2", async () => {
  const r = await runGenerate(["--max-tokens", "lots", "--prompt", "x"]);
  assertEquals(r.code, 2);
  assertStringIncludes(r.stderr, "--max-tokens");
  assertStringIncludes(r.stderr, '"lots"');
  assertEquals(r.stdout, "");
});

Deno.test("generate refuses a prompt that fills the context, with its token count, as the server does", async () => {
  // More tokens than a context of 8 holds: refused, with the count and the limit named.
  const prompt = "Once upon a time, there was a little girl named Lily";
  const tokenizer = new Tokenizer(
    parseLlama2cTokenizer(await Deno.readFile(modelFile("tok512.bin")), 512, "tok512.bin"),
  );
  const n = tokenizer.encode(prompt).length;
  assert(n > 8, `the prompt is ${n} tokens`);
  const r = await runGenerate([
    "--model",
    modelFile("stories260K.bin"),
    "--tokenizer",
    modelFile("tok512.bin"),
    "--prompt",
    prompt,
    "--context-length",
    "8",
    "--backend",
    "cpu",
  ]);
  assertEquals(r.code, 1, r.stderr);
  assertStringIncludes(
    r.stderr,
    `Cannot generate: The prompt is ${n} tokens but the model's context is 8 tokens`,
  );
  assertEquals(r.stdout, "");
});

Deno.test("generate refuses a llama2.c checkpoint without a tokenizer", async () => {
  const r = await runGenerate([
    "--model",
    modelFile("stories260K.bin"),
    "--prompt",
    "x",
    "--backend",
    "cpu",
  ]);
  assertEquals(r.code, 1);
  assertStringIncludes(r.stderr, "--tokenizer");
});

Deno.test("generate with an empty prompt starts from BOS alone, like run.c without -i", async () => {
  // run.c -n 128 without a prompt (no prompt tokens besides BOS) generates 128 tokens.
  const r = await runGenerate([
    "--model",
    modelFile("stories260K.bin"),
    "--tokenizer",
    modelFile("tok512.bin"),
    "--prompt",
    "",
    "--max-tokens",
    "128",
    "--temperature",
    "0",
    "--backend",
    "cpu",
  ]);
  assertEquals(r.code, 0, r.stderr);
  assertEquals(r.stdout, await runCText("no_prompt_n128", ""));
});

Deno.test("generate refuses --temperature -1 by name and value, not as an unknown flag", async () => {
  const { code, stderr } = await runGenerate(["--prompt", "x", "--temperature", "-1"]);
  assertEquals(code, 2);
  assertStringIncludes(stderr, "--temperature:");
  assertStringIncludes(stderr, '(received "-1")');
  assertEquals(stderr.includes("Unknown argument"), false, stderr);
});

Deno.test("generate --version and --help", async () => {
  const version = await runGenerate(["--version"]);
  assertEquals(version.code, 0);
  assert(/^llmserve \d+\.\d+\.\d+ /.test(version.stdout), version.stdout);
  const help = await runGenerate(["--help"]);
  assertStringIncludes(help.stdout, "Examples:\n  deno task generate ");
});
