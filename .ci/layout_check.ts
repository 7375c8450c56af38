/**
 * The folder-level import graph of every TypeScript file in the repository (the source,
 * `.ci/`, `tests/` and `bench/`), checked against the layer order the README's Layout section
 * documents: a folder may import only from itself and from folders below it. Run
 * `deno task layout` to print the graph; it exits 1 on a back-edge or a folder missing from the
 * order. `deno run --allow-read .ci/layout_check.ts DIR` checks the tree under DIR instead.
 * tests/layout_check_test.ts runs the same check, and the command on a tree with a back-edge.
 */

/** Lowest layer first. A folder not listed here is an error, so a new one gets a place. */
export const LAYERS: readonly string[] = [
  "kernels/wasm/as",
  "lib/util",
  // Each weight format's block layout and reference decode, once (as ggml-common.h).
  "lib/formats",
  "lib/tokenizer",
  "lib/model",
  "lib/source",
  // The contract the engines share; each engine below sits beside the others (see APART).
  "lib/engine",
  "kernels/reference",
  "kernels/webgpu",
  "kernels/wasm",
  "lib/grammar",
  "lib/core",
  "actors",
  // The data-path adapters behind the GenerationBackend contract.
  "lib/backend",
  "lib/chat",
  "lib/http",
  "lib/batch",
  // Composition: engines, pools and the several-models catalog, put together for the CLI.
  "lib/compose",
  "lib/cluster",
  "lib/cli",
  ".",
  // The CI entry and what the tests need (`.ci/needs.ts`, which tests/ci_needs_test.ts reads).
  ".ci",
  // What both the tests and the benchmarks use: the fake engine, the compat helpers, the model
  // files, the server as a child process. It imports the source only.
  "tests/harness",
  "bench",
  "bench/repro",
  // Above bench/: bench_smoke_test.ts and layout_check_test.ts test benchmark code.
  "tests",
];

/**
 * Pairs of folders that must not import each other whatever their layers: the engines stand
 * side by side on lib/engine's contract, and lib/http is handed its backend by the composition
 * (it sees lib/core/generation.ts's contract, never the adapters or the composition itself).
 */
export const APART: readonly (readonly [string, string])[] = [
  ["kernels/webgpu", "kernels/reference"],
  ["kernels/wasm", "kernels/reference"],
  ["kernels/wasm", "kernels/webgpu"],
  ["lib/http", "lib/backend"],
];

export interface ImportEdge {
  readonly from: string; // folder of the importing file
  readonly to: string; // folder of the imported file
  readonly file: string; // the importing file, for the message
  readonly specifier: string;
}

const IMPORT =
  /(?:import|export)\s[^'"]*?from\s*['"](\.[^'"]+)['"]|import\(\s*['"](\.[^'"]+)['"]\s*\)|import\s*['"](\.[^'"]+)['"]/g;

function dirOf(path: string): string {
  const i = path.lastIndexOf("/");
  return i < 0 ? "." : path.slice(0, i);
}

function normalize(path: string): string {
  const out: string[] = [];
  for (const part of path.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") out.pop();
    else out.push(part);
  }
  return out.length === 0 ? "." : out.join("/");
}

/**
 * Every relative import between the TypeScript files under `root`: hidden folders but `.ci/`
 * left out, and node_modules.
 */
export function collectEdges(root: string): ImportEdge[] {
  const edges: ImportEdge[] = [];
  const walk = (rel: string) => {
    for (const entry of Deno.readDirSync(rel === "." ? root : `${root}/${rel}`)) {
      const path = rel === "." ? entry.name : `${rel}/${entry.name}`;
      if (entry.isDirectory) {
        if ((entry.name.startsWith(".") && path !== ".ci") || entry.name === "node_modules") {
          continue;
        }
        walk(path);
      } else if (entry.isFile && entry.name.endsWith(".ts")) {
        const source = Deno.readTextFileSync(`${root}/${path}`);
        for (const m of source.matchAll(IMPORT)) {
          const specifier = (m[1] ?? m[2] ?? m[3])!;
          const target = normalize(`${dirOf(path)}/${specifier}`);
          edges.push({ from: dirOf(path), to: dirOf(target), file: path, specifier });
        }
      }
    }
  };
  walk(".");
  return edges;
}

/** The edges that break the layer order, as messages naming the file and the import. */
export function layerViolations(edges: readonly ImportEdge[]): string[] {
  const rank = new Map(LAYERS.map((folder, i) => [folder, i]));
  const problems = new Set<string>();
  for (const e of edges) {
    if (e.from === e.to) continue;
    const a = rank.get(e.from);
    const b = rank.get(e.to);
    if (a === undefined) {
      problems.add(`folder ${e.from} is not in LAYERS (.ci/layout_check.ts): give it a layer`);
    } else if (b === undefined) {
      problems.add(`folder ${e.to} (imported by ${e.file}) is not in LAYERS: give it a layer`);
    } else if (
      APART.some(([x, y]) => (x === e.from && y === e.to) || (y === e.from && x === e.to))
    ) {
      problems.add(
        `${e.file} imports "${e.specifier}": ${e.from} and ${e.to} are kept apart (APART)`,
      );
    } else if (b >= a) {
      problems.add(
        `${e.file} imports "${e.specifier}": ${e.from} (layer ${a}) may import only lower layers, ` +
          `but ${e.to} is layer ${b}`,
      );
    }
  }
  return [...problems];
}

if (import.meta.main) {
  // The repository this file is in, or another tree (tests/layout_check_test.ts passes one).
  const root = Deno.args[0] ?? new URL("..", import.meta.url).pathname.replace(/\/$/, "");
  const edges = collectEdges(root);
  const byFolder = new Map<string, Set<string>>();
  for (const e of edges) {
    if (e.from !== e.to) {
      byFolder.set(e.from, (byFolder.get(e.from) ?? new Set()).add(e.to));
    }
  }
  console.log("| layer | folder | imports |\n|--:|---|---|");
  LAYERS.forEach((folder, i) => {
    console.log(`| ${i} | ${folder} | ${[...(byFolder.get(folder) ?? [])].sort().join(", ")} |`);
  });
  const problems = layerViolations(edges);
  if (problems.length > 0) {
    console.error(`\n${problems.length} layering problem(s):\n- ${problems.join("\n- ")}`);
    Deno.exit(1);
  }
  console.log(`\n${edges.length} imports, no back-edges`);
}
