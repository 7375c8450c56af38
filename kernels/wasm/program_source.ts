/**
 * The AssemblyScript view of the step program's layout (kernels/wasm/program.ts): the
 * interpreter in kernels/wasm/as/program.ts cannot import TypeScript, so kernels/wasm/build.ts
 * writes this text to kernels/wasm/as/ops.ts before it compiles (and `--check` fails when the
 * committed file differs). Op codes and the op size then have one home, program.ts.
 */
import { NO_BARRIER, OP, OP_WORDS } from "./program.ts";

/** The file kernels/wasm/build.ts writes, relative to this module. */
export const OPS_AS_FILE = "./as/ops.ts";

/** normQuant → NORM_QUANT. */
const constName = (s: string) => s.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase();

/** The source of kernels/wasm/as/ops.ts. */
export function opsSource(): string {
  return [
    "// Generated from kernels/wasm/program.ts by kernels/wasm/build.ts (`deno task build:wasm`):",
    "// do not edit.",
    "",
    ...Object.entries(OP).map(([name, code]) =>
      `export const OP_${constName(name)}: i32 = ${code};`
    ),
    `export const OP_BYTES: usize = ${OP_WORDS * 4};`,
    `export const NO_BARRIER: i32 = ${NO_BARRIER};`,
    "",
  ].join("\n");
}
