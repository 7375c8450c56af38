/**
 * The check's doc-example runner (.ci/doc_tests.ts) refuses an example that creates a WebGPU
 * device from a file outside GPU_EXAMPLES, which would run without the exit preload.
 */
import { assertEquals } from "@std/assert";
import { filesWithExamples, GPU_EXAMPLES, unlistedGpuExamples } from "../.ci/doc_tests.ts";

const example = (body: string) =>
  `/**\n * Does a thing.\n *\n * \`\`\`ts\n${
    body.split("\n").map((l) => ` * ${l}`).join("\n")
  }\n * \`\`\`\n */\nexport const x = 1;\n// acquireGpu() outside an example does not count\n`;

Deno.test("unlistedGpuExamples() names the files whose examples create a device, and only those", async () => {
  const root = await Deno.makeTempDir({ prefix: "doc_tests_test_" });
  try {
    // The folders and main.ts the runner looks in, as in the repository.
    for (const dir of ["lib", "actors", "kernels", "bench", ".ci"]) {
      await Deno.mkdir(`${root}/${dir}`);
    }
    await Deno.writeTextFile(`${root}/main.ts`, "");
    const files = {
      "lib/acquires.ts": example("const gpu = await acquireGpu();\nconsole.log(gpu);"),
      "lib/adapter.ts": example("const a = await navigator.gpu.requestAdapter();"),
      "lib/plain.ts": example("const n = 1 + 1;\nconsole.log(n);"),
    };
    for (const [name, text] of Object.entries(files)) {
      await Deno.writeTextFile(`${root}/${name}`, text);
    }
    assertEquals(
      filesWithExamples(root).filter((f) => f.startsWith("lib/")),
      Object.keys(files).sort(),
    );
    assertEquals(unlistedGpuExamples(root, Object.keys(files)), [
      "lib/acquires.ts",
      "lib/adapter.ts",
    ]);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("every example in the repository that creates a device is in GPU_EXAMPLES", () => {
  const root = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
  assertEquals(unlistedGpuExamples(root, filesWithExamples(root)), []);
  // The listed ones do reach for a device (a file listed without need only loses its run).
  const listed = GPU_EXAMPLES.filter((f) => f.startsWith("kernels/webgpu/dispatch_count"));
  assertEquals(listed, ["kernels/webgpu/dispatch_count.ts"]);
});
