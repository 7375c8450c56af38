/**
 * The compiled kernels. Two builds of one AssemblyScript source (kernels/wasm/as/): with
 * relaxed SIMD's i8 dot product, and with plain SIMD only for runtimes without it. Both give
 * bit-identical results (the weights are kept below 128, where the relaxed instruction is
 * exact). `deno task build:wasm` rebuilds them; `deno task check` fails when the committed
 * files differ from a fresh build.
 */
export type KernelFlavour = "relaxed" | "simd";

export const KERNEL_FILES: Record<KernelFlavour, string> = {
  relaxed: "llmserve_relaxed.wasm",
  simd: "llmserve_simd.wasm",
};

const compiled = new Map<KernelFlavour, WebAssembly.Module>();

/** The kernels' bytes, read from beside this file. */
export function kernelBytes(flavour: KernelFlavour): Uint8Array {
  const url = new URL(KERNEL_FILES[flavour], import.meta.url);
  try {
    return Deno.readFileSync(url);
  } catch (e) {
    throw new Error(
      `Cannot load the CPU engine's kernels from ${url.pathname}: ${
        e instanceof Error ? e.message : e
      } (run \`deno task build:wasm\`)`,
    );
  }
}

let relaxed: boolean | undefined;

/** Whether this runtime validates the relaxed-SIMD build (read and validated once). */
export function relaxedSimdAvailable(): boolean {
  relaxed ??= WebAssembly.validate(kernelBytes("relaxed") as BufferSource);
  return relaxed;
}

/**
 * The compiled kernels: the relaxed build where the runtime has relaxed SIMD, else the plain
 * one (or the one asked for).
 */
export function kernelModule(
  flavour?: KernelFlavour,
): { module: WebAssembly.Module; flavour: KernelFlavour } {
  const f = flavour ?? (relaxedSimdAvailable() ? "relaxed" : "simd");
  let m = compiled.get(f);
  if (!m) {
    m = new WebAssembly.Module(kernelBytes(f) as BufferSource);
    compiled.set(f, m);
  }
  return { module: m, flavour: f };
}
