// Generated from kernels/wasm/program.ts by kernels/wasm/build.ts (`deno task build:wasm`):
// do not edit.

export const OP_END: i32 = 0;
export const OP_NORM_QUANT: i32 = 1;
export const OP_MATMUL: i32 = 2;
export const OP_QKV_POST: i32 = 3;
export const OP_ATTENTION: i32 = 4;
export const OP_SWIGLU: i32 = 5;
export const OP_QUANT: i32 = 6;
export const OP_ROW_STATS: i32 = 7;
export const OP_READ_SWEEP: i32 = 8;
export const OP_BYTES: usize = 128;
export const NO_BARRIER: i32 = 1;
