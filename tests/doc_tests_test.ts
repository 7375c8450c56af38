/**
 * The check's doc-example runner (.ci/doc_tests.ts) refuses an example that creates a WebGPU
 * device from a file outside GPU_EXAMPLES, which would run without the exit preload; it checks
 * the examples of README.md and docs/*.md, and the tasks they name.
 */
import { assertEquals } from "@std/assert";
import {
  checkOnlyPages,
  filesWithExamples,
  GPU_EXAMPLES,
  markdownPages,
  unknownTasks,
  unlistedGpuExamples,
  userPages,
} from "../.ci/doc_tests.ts";

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

const fence = "```";

Deno.test("markdownPages() and checkOnlyPages() pick README and docs pages, and run only those needing no server", async () => {
  const root = await Deno.makeTempDir({ prefix: "doc_tests_test_" });
  try {
    await Deno.mkdir(`${root}/docs`);
    await Deno.mkdir(`${root}/bench`);
    const pages = {
      "README.md":
        `# x\n\n${fence}ts\nconst ws = new WebSocket("ws://127.0.0.1:8000/v1/stream");\n${fence}\n`,
      "docs/plain.md":
        `${fence}ts\nconst n: number = 2;\n${fence}\n\n${fence}sh\ncurl localhost:8000\n${fence}\n`,
      "docs/gpu.md": `${fence}ts\nconst a = await navigator.gpu.requestAdapter();\n${fence}\n`,
      "docs/prose.md": "No examples; a server at localhost:8000 in prose.\n",
      "bench/README.md": `${fence}ts\nconst n = 1;\n${fence}\n`,
    };
    for (const [name, text] of Object.entries(pages)) {
      await Deno.writeTextFile(`${root}/${name}`, text);
    }
    assertEquals(userPages(root), ["README.md", "docs/gpu.md", "docs/plain.md", "docs/prose.md"]);
    const withExamples = markdownPages(root);
    assertEquals(withExamples, ["README.md", "docs/gpu.md", "docs/plain.md"]);
    // The shell block's localhost is not a TypeScript example: docs/plain.md runs.
    assertEquals(checkOnlyPages(root, withExamples), ["README.md", "docs/gpu.md"]);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("unknownTasks() names each page's `deno task` that deno.json lacks, once", async () => {
  const root = await Deno.makeTempDir({ prefix: "doc_tests_test_" });
  try {
    await Deno.mkdir(`${root}/docs`);
    await Deno.writeTextFile(
      `${root}/deno.json`,
      JSON.stringify({ tasks: { start: "x", "bench:router": "y" } }),
    );
    await Deno.writeTextFile(
      `${root}/README.md`,
      "Run `npx -y deno@2.9.6 task start`, then `deno task bench:router` and `deno task bench:gone`.\n",
    );
    await Deno.writeTextFile(
      `${root}/docs/a.md`,
      `${fence}sh\ndeno task serve --port 1\ndeno task serve\n${fence}\n`,
    );
    assertEquals(unknownTasks(root, userPages(root)), [
      "README.md: deno task bench:gone",
      "docs/a.md: deno task serve",
    ]);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("every `deno task` the README and docs/ name is a task of deno.json", () => {
  const root = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
  assertEquals(unknownTasks(root, userPages(root)), []);
});
