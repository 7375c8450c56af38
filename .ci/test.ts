/**
 * `deno task test`: meets what the tests need (`.ci/needs.ts`), then runs every group of test
 * files, each whatever the groups before it did, and ends with a summary of what ran. Exits 1
 * when a need could not be met or any group failed.
 *
 * Groups: most files run in parallel; the files that drive WebGPU in-process run one after
 * another in a second invocation. Every invocation preloads exit_without_destructors.ts, which
 * avoids a crash at exit on OpenGL ES (see there and docs/development.md).
 *
 * `deno task test tests/a_test.ts tests/b_test.ts` runs only those files, after the same set-up.
 */
import { NEEDS } from "./needs.ts";
import { runtimeDirEnv } from "../lib/util/runtime_dir.ts";

/** Test files that create a GPU device in their own process. */
export const GPU_FILES = [
  "tests/adapter_test.ts",
  "tests/architecture_engines_test.ts",
  "tests/compat_llama_cpp_webgpu_test.ts",
  "tests/doc_examples_test.ts",
  "tests/embedding_webgpu_test.ts",
  "tests/attention_test.ts",
  "tests/engine_factory_test.ts",
  "tests/kernels_test.ts",
  "tests/logit_adjust_engines_test.ts",
  "tests/top_logprobs_test.ts",
  "tests/matmul_test.ts",
  "tests/sample_test.ts",
  "tests/webgpu_engine_test.ts",
];

interface Group {
  readonly name: string;
  readonly args: string[];
}

interface GroupResult {
  readonly name: string;
  readonly code: number;
  readonly passed: number;
  readonly failed: number;
  readonly ignored: number;
  readonly seconds: number;
  /** The runner's own summary line was seen (absent when it crashed before or at the end). */
  readonly summarized: boolean;
  /** Each failed test's `name => file:line` with the first lines of its error, for the summary. */
  readonly failures: string[];
}

// deno-lint-ignore no-control-regex -- stripping the runner's colour codes
const ANSI = /\x1b\[[0-9;]*m/g;
const SUMMARY =
  /^(ok|FAILED) \| (\d+) passed(?: \([^)]*\))? \| (\d+) failed(?: \([^)]*\))?(?: \| (\d+) ignored)?/;

/** Every run ends through `_exit`: see exit_without_destructors.ts for the GL exit race. */
const PRELOAD = `--preload=${new URL("./exit_without_destructors.ts", import.meta.url).pathname}`;

function groups(selected: string[]): Group[] {
  const base = ["--allow-all", PRELOAD];
  if (selected.length > 0) return [{ name: "selected", args: [...base, ...selected] }];
  return [
    {
      name: "parallel",
      args: [...base, "--parallel", `--ignore=${GPU_FILES.join(",")}`, "tests/"],
    },
    { name: "gpu (serial)", args: [...base, ...GPU_FILES] },
  ];
}

async function runGroup(group: Group, env: Record<string, string>): Promise<GroupResult> {
  console.log(`\n=== test group: ${group.name}: deno test ${group.args.join(" ")}`);
  const started = performance.now();
  const child = new Deno.Command(Deno.execPath(), {
    args: ["test", ...group.args],
    env,
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  // Pass the output through while keeping the last lines, where deno test writes its summary,
  // and the errors it reports, which the summary repeats: CI shows only the end of a long log.
  let tail = "";
  let partial = "";
  const errors = new ErrorSection();
  const decoder = new TextDecoder();
  for await (const chunk of child.stdout) {
    await Deno.stdout.write(chunk);
    const text = decoder.decode(chunk, { stream: true });
    tail = (tail + text).slice(-4096);
    const lines = (partial + text).split("\n");
    partial = lines.pop() ?? "";
    for (const line of lines) errors.read(line.replace(ANSI, ""));
  }
  const { code } = await child.status;
  const lines = tail.replace(ANSI, "").split("\n").map((l) => l.trim());
  const m = lines.map((l) => SUMMARY.exec(l)).filter((x) => x !== null).at(-1);
  return {
    name: group.name,
    code,
    passed: m ? Number(m[2]) : 0,
    failed: m ? Number(m[3]) : 0,
    ignored: m?.[4] ? Number(m[4]) : 0,
    seconds: (performance.now() - started) / 1000,
    summarized: m !== undefined,
    failures: errors.failures,
  };
}

/** Lines of a test's error the summary repeats: the assertion and where it was thrown. */
const ERROR_LINES = 8;

/**
 * Reads deno test's ` ERRORS ` section line by line: each `name => ./file:line:col` header and
 * the first lines of the error under it (less the caret line and the runtime's own frames), until the ` FAILURES ` list that repeats the names.
 */
class ErrorSection {
  readonly failures: string[] = [];
  #inErrors = false;
  #kept = 0;

  read(line: string): void {
    const trimmed = line.trim();
    if (trimmed === "ERRORS") {
      this.#inErrors = true;
      return;
    }
    if (trimmed === "FAILURES" || SUMMARY.test(trimmed)) this.#inErrors = false;
    if (!this.#inErrors || trimmed === "") return;
    if (/ => \S+:\d+:\d+$|\(uncaught error\)$/.test(trimmed)) {
      this.failures.push(trimmed);
      this.#kept = 0;
    } else if (
      this.failures.length > 0 && this.#kept < ERROR_LINES && !/^\^+$|\(ext:/.test(trimmed)
    ) {
      this.failures.push(`    ${trimmed}`);
      this.#kept++;
    }
  }
}

async function main(args: string[]): Promise<number> {
  console.log("=== set-up");
  // The GPU tests create Vulkan instances in-process: without it Mesa prints an error for each.
  const env: Record<string, string> = { ...runtimeDirEnv() };
  const unmet: string[] = [];
  for (const need of NEEDS) {
    try {
      const got = await need.provide();
      Object.assign(env, got.env);
      console.log(`  ${need.name.padEnd(12)} ${got.how}`);
    } catch (e) {
      unmet.push(need.name);
      console.log(`  ${need.name.padEnd(12)} MISSING (${need.why}): ${(e as Error).message}`);
    }
  }
  const results: GroupResult[] = [];
  for (const group of groups(args)) results.push(await runGroup(group, env));

  console.log("\n=== summary");
  for (const r of results) {
    const verdict = r.code === 0 ? "ok" : r.summarized ? "FAILED" : `FAILED (exit ${r.code})`;
    console.log(
      `  ${r.name.padEnd(14)} ${String(r.passed).padStart(4)} passed ${
        String(r.failed).padStart(3)
      } failed ${String(r.ignored).padStart(3)} ignored  ${
        r.seconds.toFixed(0).padStart(4)
      } s  ${verdict}` +
        (r.code !== 0 && r.summarized && r.failed === 0
          ? `: deno test exited ${r.code} after its summary`
          : ""),
    );
    for (const line of r.failures) console.log(`    ${line}`);
  }
  if (unmet.length > 0) console.log(`  set-up failed for: ${unmet.join(", ")}`);
  const passed = results.reduce((s, r) => s + r.passed, 0);
  const failed = results.reduce((s, r) => s + r.failed, 0) +
    results.filter((r) => r.code !== 0 && r.failed === 0).length;
  // The plain closing line CI reads; a group that crashed without a failed test counts as one.
  console.log(`\ntests: ${passed} passed, ${failed} failed`);
  return unmet.length === 0 && results.every((r) => r.code === 0) ? 0 : 1;
}

if (import.meta.main) Deno.exit(await main(Deno.args));
