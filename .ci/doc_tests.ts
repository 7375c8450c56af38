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
 * The pages a user reads, README.md and docs/*.md ({@linkcode markdownPages}), are checked the
 * same way: their ```ts examples run as tests, except on a page where one talks to a running
 * server or a WebGPU device, which is only type-checked ({@linkcode checkOnlyPages}); and every
 * `deno task NAME` they mention must be a task of deno.json ({@linkcode unknownTasks}).
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

/** A fenced ```ts block opening in Markdown. */
const MD_EXAMPLE = /^```ts\b.*$/m;

/** The ```ts blocks of a Markdown text. */
function markdownBlocks(text: string): string[] {
  return text.split(MD_EXAMPLE).slice(1).map((b) => b.split(/^```/m)[0]!);
}

/** README.md and every docs/*.md page under `root`, sorted: the pages a user reads. */
export function userPages(root: string): string[] {
  const pages: string[] = [];
  for (const [dir, prefix] of [[root, ""], [`${root}/docs`, "docs/"]]) {
    try {
      for (const entry of Deno.readDirSync(dir!)) {
        if (!entry.isFile || !entry.name.endsWith(".md")) continue;
        if (prefix === "docs/" || entry.name === "README.md") pages.push(`${prefix}${entry.name}`);
      }
    } catch (e) {
      if (!(e instanceof Deno.errors.NotFound)) throw e;
    }
  }
  return pages.sort();
}

/** The pages of {@linkcode userPages} that hold a ```ts example. */
export function markdownPages(root: string): string[] {
  return userPages(root).filter((p) => MD_EXAMPLE.test(Deno.readTextFileSync(`${root}/${p}`)));
}

/** What in an example talks to a server it does not start: a client of the running service. */
const NEEDS_SERVER = /\b(?:localhost|127\.0\.0\.1):\d+/;

/**
 * The pages among `pages` (Markdown, relative to `root`) with an example that talks to a
 * running server or creates a WebGPU device: the check type-checks them and runs none of
 * their examples (`deno test --doc` runs a page's examples all or none).
 */
export function checkOnlyPages(root: string, pages: readonly string[]): string[] {
  return pages.filter((p) =>
    markdownBlocks(Deno.readTextFileSync(`${root}/${p}`)).some((b) =>
      NEEDS_SERVER.test(b) || NEEDS_DEVICE.test(b)
    )
  );
}

/** `deno task NAME` as the pages spell it, with or without npx and a version. */
const TASK_MENTION = /\bdeno(?:@[\d.]+)? task ([A-Za-z0-9:_-]+)/g;

/**
 * Every `deno task NAME` in `pages` (Markdown, relative to `root`) whose NAME is not a task of
 * `root`'s deno.json, as `page: deno task NAME`: a renamed or removed task leaves no page
 * telling users to run it.
 */
export function unknownTasks(root: string, pages: readonly string[]): string[] {
  const tasks = Object.keys(JSON.parse(Deno.readTextFileSync(`${root}/deno.json`)).tasks ?? {});
  const found: string[] = [];
  for (const p of pages) {
    for (const m of Deno.readTextFileSync(`${root}/${p}`).matchAll(TASK_MENTION)) {
      const line = `${p}: deno task ${m[1]}`;
      if (!tasks.includes(m[1]!) && !found.includes(line)) found.push(line);
    }
  }
  return found;
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
  const all = named.length > 0
    ? named
    : gpuRun
    ? [...GPU_EXAMPLES]
    : [...filesWithExamples(root), ...markdownPages(root)];
  const files = all.filter((f) => !f.endsWith(".md"));
  const pages = all.filter((f) => f.endsWith(".md"));
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
  const stale = named.length > 0 || gpuRun ? [] : unknownTasks(root, userPages(root));
  if (stale.length > 0) {
    console.error(
      `Cannot pass the doc check: these pages name tasks deno.json does not have:\n  ${
        stale.join("\n  ")
      }`,
    );
    Deno.exit(1);
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
  const checkOnly = checkOnlyPages(root, pages);
  const gpu = gpuRun ? [] : files.filter((f) => GPU_EXAMPLES.includes(f));
  const run = gpuRun ? files : files.filter((f) => !GPU_EXAMPLES.includes(f));
  // Pages: run where nothing needs a server or device, type-checked otherwise.
  gpu.push(...checkOnly);
  run.push(...pages.filter((p) => !checkOnly.includes(p)));
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
  console.log(
    `doc examples: ${run.length} files run, ${gpu.length} type-checked only (GPU, or a client of a running server)`,
  );
}
