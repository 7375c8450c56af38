// Generated from lib/formats by kernels/wasm/build.ts (`deno task build:wasm`): do not edit.
// Type codes are indices in lib/formats' FORMATS; offsets are bytes from a block's start.

export const T_F32: i32 = 0;
export const T_F16: i32 = 1;
export const T_BF16: i32 = 2;
export const T_Q8_0: i32 = 3;
export const T_Q4_0: i32 = 4;
export const T_Q4_1: i32 = 5;
export const T_Q5_0: i32 = 6;
export const T_Q5_1: i32 = 7;
export const T_Q2_K: i32 = 8;
export const T_Q3_K: i32 = 9;
export const T_Q4_K: i32 = 10;
export const T_Q5_K: i32 = 11;
export const T_Q6_K: i32 = 12;

/** Q8_0: 32 elements in 34 bytes. */
export const Q8_0_BYTES: usize = 34;
export const Q8_0_D: usize = 0;
export const Q8_0_QS: usize = 2;

/** Q4_0: 32 elements in 18 bytes. */
export const Q4_0_BYTES: usize = 18;
export const Q4_0_D: usize = 0;
export const Q4_0_QS: usize = 2;

/** Q4_1: 32 elements in 20 bytes. */
export const Q4_1_BYTES: usize = 20;
export const Q4_1_D: usize = 0;
export const Q4_1_M: usize = 2;
export const Q4_1_QS: usize = 4;

/** Q5_0: 32 elements in 22 bytes. */
export const Q5_0_BYTES: usize = 22;
export const Q5_0_D: usize = 0;
export const Q5_0_QH: usize = 2;
export const Q5_0_QS: usize = 6;

/** Q5_1: 32 elements in 24 bytes. */
export const Q5_1_BYTES: usize = 24;
export const Q5_1_D: usize = 0;
export const Q5_1_M: usize = 2;
export const Q5_1_QH: usize = 4;
export const Q5_1_QS: usize = 8;

/** Q2_K: 256 elements in 84 bytes. */
export const Q2_K_BYTES: usize = 84;
export const Q2_K_SCALES: usize = 0;
export const Q2_K_QS: usize = 16;
export const Q2_K_D: usize = 80;
export const Q2_K_DMIN: usize = 82;

/** Q3_K: 256 elements in 110 bytes. */
export const Q3_K_BYTES: usize = 110;
export const Q3_K_HMASK: usize = 0;
export const Q3_K_QS: usize = 32;
export const Q3_K_SCALES: usize = 96;
export const Q3_K_D: usize = 108;

/** Q4_K: 256 elements in 144 bytes. */
export const Q4_K_BYTES: usize = 144;
export const Q4_K_D: usize = 0;
export const Q4_K_DMIN: usize = 2;
export const Q4_K_SCALES: usize = 4;
export const Q4_K_QS: usize = 16;

/** Q5_K: 256 elements in 176 bytes. */
export const Q5_K_BYTES: usize = 176;
export const Q5_K_D: usize = 0;
export const Q5_K_DMIN: usize = 2;
export const Q5_K_SCALES: usize = 4;
export const Q5_K_QH: usize = 16;
export const Q5_K_QS: usize = 48;

/** Q6_K: 256 elements in 210 bytes. */
export const Q6_K_BYTES: usize = 210;
export const Q6_K_QL: usize = 0;
export const Q6_K_QH: usize = 128;
export const Q6_K_SCALES: usize = 192;
export const Q6_K_D: usize = 208;

/** Bytes per block of a type (the element's bytes for the float types). */
// @ts-ignore: decorator
@inline export function blockBytes(type: i32): usize {
  return type == T_F32 ? 4
    : type == T_F16 ? 2
    : type == T_BF16 ? 2
    : type == T_Q8_0 ? 34
    : type == T_Q4_0 ? 18
    : type == T_Q4_1 ? 20
    : type == T_Q5_0 ? 22
    : type == T_Q5_1 ? 24
    : type == T_Q2_K ? 84
    : type == T_Q3_K ? 110
    : type == T_Q4_K ? 144
    : type == T_Q5_K ? 176
    : type == T_Q6_K ? 210
    : 0;
}

/** Bytes of one weight row of K elements. */
export function rowBytes(type: i32, K: i32): i32 {
  switch (type) {
    case T_F32: return K * 4;
    case T_F16: return K * 2;
    case T_BF16: return K * 2;
    case T_Q8_0: return (K >> 5) * 34;
    case T_Q4_0: return (K >> 5) * 18;
    case T_Q4_1: return (K >> 5) * 20;
    case T_Q5_0: return (K >> 5) * 22;
    case T_Q5_1: return (K >> 5) * 24;
    case T_Q2_K: return (K >> 8) * 84;
    case T_Q3_K: return (K >> 8) * 110;
    case T_Q4_K: return (K >> 8) * 144;
    case T_Q5_K: return (K >> 8) * 176;
    case T_Q6_K: return (K >> 8) * 210;
  }
  return 0;
}
