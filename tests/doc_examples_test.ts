/**
 * The doc examples `deno task check` only type-checks, because they need a WebGPU device
 * (.ci/doc_tests.ts's GPU_EXAMPLES), run here, where the suite's WebGPU group has one.
 */
import { assertEquals } from "@std/assert";

const runner = new URL("../.ci/doc_tests.ts", import.meta.url).pathname;

Deno.test("the doc examples that need a WebGPU device run and pass", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-read", "--allow-run", "--allow-env", runner, "--gpu"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  assertEquals(out.code, 0, text);
});
