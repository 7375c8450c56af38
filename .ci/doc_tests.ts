/**
 * The doc tests of `deno task check`: every ```ts example in a doc comment is type-checked and
 * run (`deno test --doc`), so an example that no longer compiles or no longer does what its
 * asserts say fails the check.
 *
 * Examples read the test models by bare name (`loadModel("stories260K.bin")`), so they run with
 * the models directory as working directory: `$MODEL_MIRROR`, or `../shared/models` beside the
 * repository as `.ci/run` defaults it. They get read and environment access only: no network,
 * no writes, no subprocesses (the GPU run adds FFI, for the preload that exits through `_exit`).
 *
 * The examples of the files in {@linkcode GPU_EXAMPLES} need a WebGPU device, so the check
 * only type-checks them; `--gpu` runs them instead (tests/doc_examples_test.ts does, in the
 * test suite's WebGPU group).
 *
 * `deno run --allow-read --allow-run --allow-env .ci/doc_tests.ts [--gpu] [FILE...]` runs
 * these files' examples only.
 */

/** Files whose examples drive a WebGPU device: type-checked, not run. */
export const GPU_EXAMPLES: readonly string[] = [
  "kernels/webgpu/classifier.ts",
  "kernels/webgpu/device.ts",
  "kernels/webgpu/dispatch_count.ts",
  "kernels/webgpu/gpu_matrix.ts",
  "kernels/webgpu/matmul.ts",
  "kernels/webgpu/webgpu_engine.ts",
  "bench/kernels_bench.ts",
  "bench/matmul_formats_bench.ts",
];

/** Where examples are looked for; kernels/wasm/as/ is AssemblyScript, not TypeScript. */
const ROOTS = ["main.ts", "lib", "actors", "kernels", "bench", ".ci"];
const SKIP = new Set(["kernels/wasm/as"]);

/** A fenced ```ts block opening in a doc comment. */
const EXAMPLE = /^\s*\*\s*```ts\b/m;

/** Every TypeScript file under `root`'s source folders with an example, sorted. */
export function filesWithExamples(root: string): string[] {
  const found: string[] = [];
  const visit = (rel: string) => {
    const info = Deno.statSync(`${root}/${rel}`);
    if (info.isDirectory) {
      if (SKIP.has(rel)) return;
      for (const entry of Deno.readDirSync(`${root}/${rel}`)) visit(`${rel}/${entry.name}`);
    } else if (rel.endsWith(".ts") && EXAMPLE.test(Deno.readTextFileSync(`${root}/${rel}`))) {
      found.push(rel);
    }
  };
  for (const r of ROOTS) visit(r);
  return found.sort();
}

/** What in an example reaches for a WebGPU device. */
const NEEDS_DEVICE = /\bacquireGpu\s*\(|\bnavigator\.gpu\b|\brequestAdapter\s*\(/;

/**
 * The files among `files` (relative to `root`) whose doc examples reach for a WebGPU device
 * while not in {@linkcode GPU_EXAMPLES}. Run by the check, such an example creates a device in
 * a process without the preload that exits through `_exit`, and on OpenGL ES the process may
 * then crash at exit (seen: `malloc_consolidate(): invalid chunk size` after every example
 * passed, kernels/webgpu/dispatch_count.ts's).
 */
export function unlistedGpuExamples(root: string, files: readonly string[]): string[] {
  return files.filter((f) => {
    if (GPU_EXAMPLES.includes(f)) return false;
    const text = Deno.readTextFileSync(`${root}/${f}`);
    const blocks = text.split(EXAMPLE).slice(1).map((b) => b.split("```")[0]!);
    return blocks.some((b) => NEEDS_DEVICE.test(b));
  });
}

async function deno(args: string[], cwd: string): Promise<boolean> {
  console.log(`$ (cd ${cwd} && deno ${args.join(" ")})`);
  const { code } = await new Deno.Command(Deno.execPath(), { args, cwd }).spawn().status;
  return code === 0;
}

if (import.meta.main) {
  const root = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
  const gpuRun = Deno.args.includes("--gpu");
  const named = Deno.args.filter((a) => a !== "--gpu");
  const files = named.length > 0 ? named : gpuRun ? [...GPU_EXAMPLES] : filesWithExamples(root);
  const models = Deno.env.get("MODEL_MIRROR") ?? `${root}/../shared/models`;
  for (const name of ["stories260K.bin", "stories260K.gguf", "tok512.bin"]) {
    try {
      Deno.statSync(`${models}/${name}`);
    } catch {
      console.error(
        `Cannot run the doc examples: ${models}/${name} is missing; set MODEL_MIRROR to the test models directory`,
      );
      Deno.exit(1);
    }
  }
  const unlisted = gpuRun ? [] : unlistedGpuExamples(root, files);
  if (unlisted.length > 0) {
    console.error(
      `Cannot run the doc examples of ${
        unlisted.join(", ")
      } in the check: they create a WebGPU device; list them in GPU_EXAMPLES (.ci/doc_tests.ts), which the WebGPU test group runs`,
    );
    Deno.exit(1);
  }
  const gpu = gpuRun ? [] : files.filter((f) => GPU_EXAMPLES.includes(f));
  const run = gpuRun ? files : files.filter((f) => !GPU_EXAMPLES.includes(f));
  // As every WebGPU test run: see exit_without_destructors.ts for the crash at exit on GL.
  const preload = gpuRun
    ? ["--allow-ffi", `--preload=${root}/.ci/exit_without_destructors.ts`]
    : [];
  const abs = (fs: string[]) => fs.map((f) => `${root}/${f}`);
  const config = ["--config", `${root}/deno.json`];
  let ok = true;
  if (gpu.length > 0) ok = await deno(["check", "--doc-only", ...config, ...abs(gpu)], root) && ok;
  if (run.length > 0) {
    ok = await deno(
      [
        "test",
        "--doc",
        "--quiet",
        "--allow-read",
        "--allow-env",
        ...preload,
        ...config,
        ...abs(run),
      ],
      models,
    ) && ok;
  }
  if (!ok) Deno.exit(1);
  console.log(`doc examples: ${run.length} files run, ${gpu.length} type-checked only (GPU)`);
}
