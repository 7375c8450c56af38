/**
 * XGrammar (`@mlc-ai/web-xgrammar`, its C++ compiled to WebAssembly; what WebLLM runs) loaded
 * as the CommonJS bundle it is. Its `lib/index.js` is a UMD bundle that reads `require` and
 * `__filename`, but its package.json says `"type": "module"`, so Deno's `import` evaluates it as
 * an ES module and it fails ("require is not defined"). The importing of its package.json below
 * makes Deno fetch the package like any npm dependency (and the lockfile pin it); the bundle is
 * then read from the package and run as CommonJS with the five variables a CommonJS module gets,
 * plus a `console` whose errors are kept: XGrammar reports a bad schema or grammar on stderr and
 * aborts, and the message belongs in the client's 400, not in the server's log.
 */
import pkg from "@mlc-ai/web-xgrammar/package.json" with { type: "json" };
import { createRequire } from "node:module";
import { dirname } from "node:path";
import { fileURLToPath } from "node:url";
import type * as XG from "@mlc-ai/web-xgrammar";

export type XGrammar = typeof XG;
export type {
  CompiledGrammar,
  GrammarCompiler,
  GrammarMatcher,
  StructuralTag,
  TokenizerInfo,
} from "@mlc-ai/web-xgrammar";

/** The version loaded, for logs and /props. */
export const XGRAMMAR_VERSION: string = pkg.version;

/** The bundle's path in Deno's npm cache: what a server reads to constrain output (permissions). */
export const XGRAMMAR_BUNDLE: string = fileURLToPath(
  import.meta.resolve(`@mlc-ai/web-xgrammar/${pkg.main}`),
);

/** What XGrammar wrote to stderr most recently (its reason for an abort). */
const diagnostics: string[] = [];

let loading: Promise<XGrammar> | undefined;

/** XGrammar's WebAssembly memory, once instantiated (see withHeapProbe). */
let heap: WebAssembly.Memory | undefined;

/**
 * Bytes of XGrammar's WebAssembly heap in this thread (it only grows): what its tokenizer data,
 * compilers and grammars take. 0 before XGrammar is first used here.
 */
export function xgrammarHeapBytes(): number {
  return heap?.buffer.byteLength ?? 0;
}

/**
 * The XGrammar module, loaded once per process (its WebAssembly is instantiated on first use by
 * XGrammar itself), its WebAssembly heap bounded to `memoryBytes`, from `file` (the bundle of
 * the npm package by default).
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const xg = await loadXGrammar();
 * assertEquals(await loadXGrammar(), xg); // once per process
 * const info = await xg.TokenizerInfo.createTokenizerInfo(["a", "b", "</s>"], "raw", false, 3, [2]);
 * ```
 */
export function loadXGrammar(
  memoryBytes?: number,
  file: string = XGRAMMAR_BUNDLE,
): Promise<XGrammar> {
  loading ??= (async () => {
    const source = withHeapProbe(withHeapMax(await Deno.readTextFile(file), memoryBytes));
    const module = { exports: {} as Record<string, unknown> };
    const quiet = {
      ...console,
      error: (...args: unknown[]) => keep(args),
      warn: (...args: unknown[]) => keep(args),
    };
    // CommonJS's wrapper, as Node's loader builds it, with `console` added.
    const run = new Function(
      "exports",
      "require",
      "module",
      "__filename",
      "__dirname",
      "console",
      "__heap",
      source,
    );
    const probe = (m: WebAssembly.Memory) => heap = m;
    run(module.exports, createRequire(file), module, file, dirname(file), quiet, probe);
    return module.exports as unknown as XGrammar;
  })();
  return loading;
}

/** Emscripten's heap limit as the bundle states it (2 GiB). */
const HEAP_MAX = "getHeapMax=()=>2147483648";

/**
 * The bundle with its heap limit lowered to `bytes`: growing past it fails an allocation, which
 * aborts (a trap the pool answers by restarting the worker), instead of taking the machine's
 * memory. Throws when the bundle no longer states its limit where this expects it.
 */
function withHeapMax(source: string, bytes: number | undefined): string {
  if (bytes === undefined) return source;
  if (!source.includes(HEAP_MAX)) {
    throw new Error(`XGrammar ${pkg.version}'s bundle has no '${HEAP_MAX}' to bound its memory`);
  }
  return source.replace(HEAP_MAX, `getHeapMax=()=>${Math.floor(bytes / 65536) * 65536}`);
}

/** Where the bundle takes its WebAssembly memory from the instance. */
const HEAP_SET = 'wasmMemory=wasmExports["S"];';

/**
 * The bundle with its WebAssembly memory handed to `__heap` as it is instantiated, for
 * xgrammarHeapBytes; a bundle that no longer says it that way is run as it is (the size then
 * reads 0, and nothing else depends on it).
 */
function withHeapProbe(source: string): string {
  return source.replace(HEAP_SET, `${HEAP_SET}__heap(wasmMemory);`);
}

function keep(args: unknown[]): void {
  diagnostics.push(args.map(String).join(" "));
  if (diagnostics.length > 8) diagnostics.shift();
}

/**
 * Runs an XGrammar call and turns its abort into an Error carrying XGrammar's own message
 * ("[FATAL] …json_schema_converter.cc:3460: Check failed: … Failed to parse JSON …" becomes
 * "Failed to parse JSON …").
 */
export async function xgrammarCall<T>(call: () => T | Promise<T>): Promise<T> {
  diagnostics.length = 0;
  try {
    return await call();
  } catch (e) {
    const fatal = diagnostics.filter((d) => d.includes("[FATAL]")).pop();
    const said = fatal ?? diagnostics.pop();
    if (said === undefined) throw e;
    throw new XGrammarError(cleanDiagnostic(said), { cause: e }, fatal !== undefined);
  }
}

/**
 * XGrammar refused a schema or grammar; the message is its own. `checked`: it said why in a
 * [FATAL] line, an error its own checks raised (the instance stays sound), not a trap.
 */
export class XGrammarError extends Error {
  override readonly name = "XGrammarError";
  constructor(message: string, options: ErrorOptions, readonly checked: boolean) {
    super(message, options);
  }
}

/** "[FATAL] /path/file.cc:12: Check failed: (x) is false: why" → "why". */
function cleanDiagnostic(line: string): string {
  return line
    .replace(/^\s*\[FATAL\]\s*\S+:\d+:\s*/, "")
    .replace(/^Check failed: \(.*?\) is false:\s*/, "")
    .trim();
}
