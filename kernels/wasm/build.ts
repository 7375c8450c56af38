/**
 * Builds the CPU engine's kernels from kernels/wasm/as/ with the AssemblyScript compiler
 * pinned here, into kernels/wasm/llmserve_{relaxed,simd}.wasm, after writing
 * kernels/wasm/as/formats.ts from lib/formats and kernels/wasm/as/ops.ts from program.ts.
 *
 *   deno task build:wasm           writes the four files
 *   deno task build:wasm --check   exits 1 when a committed file differs from a fresh build
 */
import asc from "assemblyscript/asc";
import { KERNEL_FILES, type KernelFlavour } from "./kernel_module.ts";
import { FORMATS_AS_FILE, formatsSource } from "./formats_source.ts";
import { OPS_AS_FILE, opsSource } from "./program_source.ts";
import { unrollLoops } from "./unroll.ts";

const FEATURES: Record<KernelFlavour, string> = {
  relaxed: "simd,threads,relaxed-simd",
  simd: "simd,threads",
};

/** Compiles one flavour; throws with the compiler's messages on failure. */
export async function buildKernels(flavour: KernelFlavour): Promise<Uint8Array> {
  const entry = new URL("./as/program.ts", import.meta.url).pathname;
  let out: Uint8Array | undefined;
  const { error, stderr } = await asc.main([
    entry,
    "--runtime",
    "stub",
    "--importMemory",
    "--sharedMemory",
    "--initialMemory",
    "1",
    "--maximumMemory",
    "65536",
    "-O3",
    "--noAssert",
    "--enable",
    FEATURES[flavour],
    "-o",
    "kernels.wasm",
  ], {
    readFile(name: string, baseDir: string) {
      try {
        return unrollLoops(Deno.readTextFileSync(`${baseDir}/${name}`), name);
      } catch (e) {
        if (e instanceof Deno.errors.NotFound) return null;
        throw e;
      }
    },
    writeFile(name: string, contents: Uint8Array | string) {
      if (name.endsWith(".wasm")) out = contents as Uint8Array;
    },
  });
  if (error || !out) {
    throw new Error(
      `Cannot build the ${flavour} kernels: ${error?.message ?? "no output"}\n${stderr}`,
    );
  }
  return out;
}

if (import.meta.main) {
  const check = Deno.args.includes("--check");
  let stale = 0;
  // The AssemblyScript sources generated from TypeScript, and where they come from.
  const generated: [string, string, string][] = [
    [FORMATS_AS_FILE, formatsSource(), "lib/formats"],
    [OPS_AS_FILE, opsSource(), "kernels/wasm/program.ts"],
  ];
  for (const [file, text, from] of generated) {
    const path = new URL(file, import.meta.url);
    if (!check) Deno.writeTextFileSync(path, text);
    else if (Deno.readTextFileSync(path) !== text) {
      console.error(`${path.pathname} differs from ${from}: run \`deno task build:wasm\``);
      stale++;
    }
  }
  for (const flavour of Object.keys(KERNEL_FILES) as KernelFlavour[]) {
    const fresh = await buildKernels(flavour);
    const path = new URL(KERNEL_FILES[flavour], import.meta.url);
    if (check) {
      let committed: Uint8Array | undefined;
      try {
        committed = Deno.readFileSync(path);
      } catch { /* missing: stale */ }
      const same = committed !== undefined && committed.length === fresh.length &&
        committed.every((b, i) => b === fresh[i]);
      if (!same) {
        console.error(`${path.pathname} differs from a fresh build: run \`deno task build:wasm\``);
        stale++;
      }
    } else {
      Deno.writeFileSync(path, fresh);
      console.log(`wrote ${path.pathname} (${fresh.length} bytes)`);
    }
  }
  if (stale > 0) Deno.exit(1);
}
