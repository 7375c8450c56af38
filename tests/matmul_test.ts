import { assert, assertEquals, assertLess } from "@std/assert";
import { laneSubgroupsFit, requestDefaultAdapter } from "../kernels/webgpu/adapter.ts";
import { acquireGpu, type Gpu } from "../kernels/webgpu/device.ts";
import { interleaveRows, uploadMatrix } from "../kernels/webgpu/gpu_matrix.ts";
import { createMatmul, type MatmulEpilogue, type MatmulLayout } from "../kernels/webgpu/matmul.ts";
import { DIM_ROWS, DIM_SAMPLES, type SampleMeta } from "../kernels/webgpu/step_meta.ts";
import { dequantize } from "../lib/model/dequantize.ts";
import { matvec, rmsnorm, rope, silu } from "../kernels/reference/ops.ts";
import { uploadRopeTable } from "../kernels/webgpu/rope.ts";
import { pagedAttention } from "../kernels/reference/paged_attention.ts";
import { PagedKvCache } from "../kernels/reference/paged_kv_cache.ts";
import type { ModelConfig } from "../lib/model/model_config.ts";
import { BLOCK_LAYOUT, TENSOR_TYPES, type TensorType } from "../lib/model/tensor.ts";
import {
  randomF32,
  randomTensor,
  readF32,
  relativeError,
  rng,
  runPass,
  stepMeta,
  storage,
  testGpu,
  zeros,
} from "./_gpu.ts";

const TYPES: TensorType[] = TENSOR_TYPES;
/** The types the engine read before the K-quants; every epilogue runs on these. */
const ORIGINAL_TYPES: TensorType[] = ["f32", "f16", "q8_0", "q4_0"];
/** The smallest multiple of the type's block at least n wide (K-quant rows are 256-element blocks). */
const width = (type: TensorType, n: number) => {
  const e = BLOCK_LAYOUT[type].elements;
  return Math.ceil(n / e) * e;
};
/** Both work splits run on every device, whichever one the device picks by default. */
const LAYOUTS: MatmulLayout[] = ["split", "lane"];

interface Case {
  type: TensorType;
  outF: number;
  inF: number;
  rows: number;
  seed: number;
  epilogue?: MatmulEpilogue;
  norm?: boolean;
  /** Input rows to gather (the final norm + logits), instead of rows 0..rows-1. */
  gather?: number[];
  layout?: MatmulLayout;
}

function dims(gpu: Gpu, rows: number, gather?: number[]) {
  const sample = (row: number): SampleMeta => ({
    row,
    lastSlot: 0,
    seed: 0,
    position: 0,
    temperature: 0,
    topK: 0,
    topP: 1,
    minP: 0,
  });
  return stepMeta(gpu, {
    rows: Array.from({ length: rows }, () => ({ token: 0, pos: 0, seq: 0, slot: 0 })),
    seqs: [],
    samples: (gather ?? []).map(sample),
    blockTables: [],
  });
}

/** Runs the matmul on the GPU and its CPU twin (dequantize, rmsnorm, matvec, silu); returns [gpu, cpu]. */
async function compare(gpu: Gpu, c: Case): Promise<[Float32Array, Float32Array]> {
  const rand = rng(c.seed);
  const epilogue = c.epilogue ?? "store";
  const w = randomTensor(rand, c.type, c.outF, c.inF, "w");
  const up = epilogue === "swiglu" ? randomTensor(rand, c.type, c.outF, c.inF, "up") : undefined;
  const x = randomF32(rand, c.rows * c.inF, 2);
  const normW = randomF32(rand, c.inF);
  const outRows = c.gather?.length ?? c.rows;
  const y0 = randomF32(rand, outRows * c.outF);
  const m = uploadMatrix(gpu, up ? interleaveRows(w, up, "gate_up") : w);
  const meta = dims(gpu, c.rows, c.gather);
  const yb = storage(gpu, y0);
  const op = createMatmul(gpu, m, {
    dims: meta.dims,
    x: storage(gpu, x),
    y: yb,
    rowsField: c.gather ? DIM_SAMPLES : DIM_ROWS,
    epilogue,
    norm: c.norm ? { weight: storage(gpu, normW), eps: 1e-5 } : undefined,
    samples: c.gather ? meta.samples : undefined,
    layout: c.layout,
  });
  await runPass(gpu, (pass) => op.encode(pass, outRows));
  const got = await readF32(gpu, yb, outRows * c.outF);

  const dense = dequantize(w);
  const denseUp = up ? dequantize(up) : undefined;
  const want = new Float32Array(outRows * c.outF);
  for (let r = 0; r < outRows; r++) {
    const src = c.gather?.[r] ?? r;
    let xr: Float32Array = x.slice(src * c.inF, (src + 1) * c.inF);
    if (c.norm) xr = rmsnorm(new Float32Array(c.inF), xr, normW, 1e-5);
    const out = matvec(new Float32Array(c.outF), dense, xr);
    const u = denseUp ? matvec(new Float32Array(c.outF), denseUp, xr) : undefined;
    for (let o = 0; o < c.outF; o++) {
      const v = u ? silu(out[o]!) * u[o]! : out[o]!;
      want[r * c.outF + o] = (epilogue === "accumulate" ? y0[r * c.outF + o]! : 0) + v;
    }
  }
  return [got, want];
}

for (const type of TYPES) {
  Deno.test(`createMatmul() ${type} matches dequantize + matvec for 1, 3 and 19 rows`, async () => {
    const gpu = await testGpu();
    for (
      const [outF, inWanted, rows] of [[40, 64, 1], [33, 96, 3], [17, 256, 19], [70, 64, 37], [
        6,
        4096,
        2,
      ]] as const
    ) {
      // Widened to whole blocks (K-quants: 256), so every type runs every shape, one row too.
      const inF = width(type, inWanted);
      for (const layout of LAYOUTS) {
        const [got, want] = await compare(gpu, {
          type,
          outF,
          inF,
          rows,
          seed: outF * 31 + rows,
          layout,
        });
        const err = relativeError(got, want);
        assertLess(
          err,
          1e-5,
          `${type} ${layout} [${outF}x${inF}] x ${rows} rows: relative error ${err}`,
        );
      }
    }
  });
}

Deno.test("createMatmul() f32/f16 handle rows that are not a multiple of 32 (stories260K's 172-wide ffn_down)", async () => {
  const gpu = await testGpu();
  for (const type of ["f32", "f16"] as const) {
    for (const layout of LAYOUTS) {
      const [got, want] = await compare(gpu, {
        type,
        outF: 64,
        inF: 172,
        rows: 9,
        seed: 3,
        layout,
      });
      assertLess(relativeError(got, want), 1e-5, `${type} ${layout}`);
    }
  }
});

Deno.test("createMatmul() epilogues: residual add, fused RMSNorm, SwiGLU of interleaved gate/up rows, gathered rows", async () => {
  const gpu = await testGpu();
  for (const type of TYPES) {
    const cases: [string, Case][] = [
      ["accumulate", {
        type,
        outF: 24,
        inF: width(type, 64),
        rows: 5,
        seed: 7,
        epilogue: "accumulate",
      }],
      ["norm", { type, outF: 24, inF: width(type, 96), rows: 10, seed: 8, norm: true }],
      ["norm + swiglu", {
        type,
        outF: 21,
        inF: width(type, 64),
        rows: 9,
        seed: 9,
        norm: true,
        epilogue: "swiglu",
      }],
      ["gathered norm", {
        type,
        outF: 30,
        inF: width(type, 64),
        rows: 12,
        seed: 10,
        norm: true,
        gather: [11, 0, 4],
      }],
    ];
    // The epilogues are the same text for every type; only the chunk reader differs, and it is
    // exercised in both its single and its dual (gate + up) use by "norm + swiglu". So the
    // types added for real-world files run that case only (each variant costs a shader
    // compile, slow on CPU rasterizers).
    const run = ORIGINAL_TYPES.includes(type)
      ? cases
      : cases.filter(([w]) => w === "norm + swiglu");
    for (const [what, c] of run) {
      for (const layout of LAYOUTS) {
        const [got, want] = await compare(gpu, { ...c, layout });
        const err = relativeError(got, want);
        assertLess(err, 1e-5, `${type} ${layout} ${what}: relative error ${err}`);
      }
    }
  }
});

Deno.test("createMatmul() gives each row the same bits whatever the batch around it", async () => {
  const gpu = await testGpu();
  const n = 37; // several row tiles of either layout, the last one partial
  for (const type of TYPES) {
    const k = width(type, 64);
    for (const layout of LAYOUTS) {
      const rand = rng(99);
      const w = uploadMatrix(gpu, randomTensor(rand, type, 20, k));
      const normW = storage(gpu, randomF32(rand, k));
      const x = randomF32(rand, n * k);
      const run = async (xs: Float32Array, rows: number) => {
        const meta = dims(gpu, rows);
        const y = storage(gpu, new Float32Array(rows * 20));
        const op = createMatmul(gpu, w, {
          dims: meta.dims,
          x: storage(gpu, xs),
          y,
          rowsField: DIM_ROWS,
          norm: { weight: normW, eps: 1e-5 },
          layout,
        });
        await runPass(gpu, (pass) => op.encode(pass, rows));
        return readF32(gpu, y, rows * 20);
      };
      const batch = await run(x, n);
      for (const r of [0, 5, 12, 17, 36]) {
        const alone = await run(x.slice(r * k, (r + 1) * k), 1);
        assert(
          alone.every((v, i) => v === batch[r * 20 + i]),
          `${type} ${layout}: row ${r} alone differs from row ${r} in a batch of ${n}`,
        );
      }
    }
  }
});

Deno.test("createMatmul() splits a matrix larger than one binding into row chunks", async () => {
  // A 1 KiB binding cap forces several chunks per matrix.
  const gpu = await acquireGpu({ maxBindingBytes: 1024 });
  for (const type of TYPES) {
    assert(
      uploadMatrix(gpu, randomTensor(rng(5), type, 50, width(type, 64))).chunks.length > 1,
      `${type} should need several chunks`,
    );
    for (
      const c of LAYOUTS.flatMap((layout) => [
        { type, outF: 50, inF: width(type, 64), rows: 3, seed: 5, layout },
        {
          type,
          outF: 25,
          inF: width(type, 64),
          rows: 3,
          seed: 6,
          epilogue: "swiglu" as const,
          norm: true,
          layout,
        },
      ])
    ) {
      const [got, want] = await compare(gpu, c);
      assertLess(relativeError(got, want), 1e-5, `${type} ${c.layout} ${c.epilogue ?? "store"}`);
    }
  }
  gpu.device.destroy();
});

/** The rope tests' heads: 4 query heads and 2 KV heads of 8. */
const ROPE_HEADS = { nHeads: 4, nKvHeads: 2, headDim: 8 } as const;

function ropeConfig(
  architecture: ModelConfig["architecture"],
  dim: number,
  ropeDim: number,
): ModelConfig {
  return {
    architecture,
    dim,
    hiddenDim: 8,
    nLayers: 1,
    ...ROPE_HEADS,
    vocabSize: 8,
    contextLength: 300,
    ropeTheta: 10000,
    ropeDim,
    rmsEps: 1e-5,
  };
}

/** 11 token rows at positions across the table, each with its own KV slot of 40. */
const ropeRows = () =>
  Array.from({ length: 11 }, (_, i) => ({
    token: 0,
    pos: [0, 1, 7, 299, 128][i % 5]!,
    seq: 0,
    slot: (i * 7 + 3) % 40,
  }));

/**
 * Checks each row's q (in y) and k, v (at its slot) against the reference: RMSNorm, the dense
 * q | k | v product plus `bias`, then rope on q and k.
 */
function assertRopeRows(
  got: { y: Float32Array; k: Float32Array; v: Float32Array },
  rows: readonly { pos: number; slot: number }[],
  ref: {
    dense: Float32Array;
    x: Float32Array;
    normW: Float32Array;
    dim: number;
    ropeDim: number;
    bias?: Float32Array;
  },
): void {
  const { nHeads, nKvHeads, headDim } = ROPE_HEADS;
  const qDim = nHeads * headDim;
  const kvDim = nKvHeads * headDim;
  const stride = qDim + 2 * kvDim;
  const { dense, x, normW, dim, ropeDim, bias } = ref;
  rows.forEach((r, i) => {
    const xr = rmsnorm(new Float32Array(dim), x.slice(i * dim, (i + 1) * dim), normW, 1e-5);
    const out = matvec(new Float32Array(stride), dense, xr).map((v, f) => v + (bias?.[f] ?? 0));
    const q = rope(out.slice(0, qDim), nHeads, headDim, ropeDim, r.pos, 10000);
    const k = rope(out.slice(qDim, qDim + kvDim), nKvHeads, headDim, ropeDim, r.pos, 10000);
    const v = out.slice(qDim + kvDim);
    const at = (b: Float32Array, off: number, n: number) => b.subarray(off, off + n);
    assertLess(relativeError(at(got.y, i * stride, qDim), q), 1e-5, `q of row ${i}`);
    assertLess(relativeError(at(got.k, r.slot * kvDim, kvDim), k), 1e-5, `k of row ${i}`);
    assertLess(relativeError(at(got.v, r.slot * kvDim, kvDim), v), 1e-5, `v of row ${i}`);
  });
}

// 1024-wide f32 rows: the split layout's widest reduction (KS = 32, two outputs per workgroup).
for (const layout of ["lane", "split"] as const) {
  for (
    const [type, ropeDim, cap, dim] of [["f32", 8, undefined, 64], ["q8_0", 4, 1024, 64], [
      "f32",
      8,
      undefined,
      1024,
    ]] as const
  ) {
    Deno.test(`createMatmul() rope epilogue (${layout}, ${type}, ropeDim ${ropeDim}, rows of ${dim}${cap ? ", split matrix" : ""}) projects q | k | v, rotates q and k like the reference rope and stores k and v at each row's slot`, async () => {
      const gpu = cap ? await acquireGpu({ maxBindingBytes: cap }) : await testGpu();
      const { nHeads, nKvHeads, headDim } = ROPE_HEADS;
      const qDim = nHeads * headDim;
      const kvDim = nKvHeads * headDim;
      const stride = qDim + 2 * kvDim;
      const config = ropeConfig("llama", dim, ropeDim);
      const rand = rng(41 + ropeDim);
      const w = randomTensor(rand, type, stride, dim, "wqkv");
      const x = randomF32(rand, 11 * dim, 2);
      const normW = randomF32(rand, dim);
      const rows = ropeRows();
      const meta = stepMeta(gpu, { rows, seqs: [], samples: [], blockTables: [] });
      const y = zeros(gpu, rows.length * stride * 4);
      const kc = zeros(gpu, 40 * kvDim * 4);
      const vc = zeros(gpu, 40 * kvDim * 4);
      const m = uploadMatrix(gpu, w);
      if (cap) assert(m.chunks.length > 1, "the binding cap should split the matrix");
      const op = createMatmul(gpu, m, {
        dims: meta.dims,
        x: storage(gpu, x),
        y,
        yStride: stride,
        rowsField: DIM_ROWS,
        norm: { weight: storage(gpu, normW), eps: 1e-5 },
        epilogue: "rope",
        rope: {
          shape: { qDim, kvDim, headDim, ropeDim },
          rows: meta.rows,
          table: uploadRopeTable(gpu, config, config.contextLength),
          kCache: kc,
          vCache: vc,
        },
        layout,
      });
      await runPass(gpu, (pass) => op.encode(pass, rows.length));
      const gotY = await readF32(gpu, y, rows.length * stride);
      const gotK = await readF32(gpu, kc, 40 * kvDim);
      const gotV = await readF32(gpu, vc, 40 * kvDim);
      assertRopeRows({ y: gotY, k: gotK, v: gotV }, rows, {
        dense: dequantize(w),
        x,
        normW,
        dim,
        ropeDim,
      });
      if (cap) gpu.device.destroy();
    });
  }
}

Deno.test("createMatmul() refuses the rope epilogue without its buffers, and its buffers without the epilogue", async () => {
  const gpu = await testGpu();
  const m = uploadMatrix(gpu, randomTensor(rng(3), "f32", 16, 8));
  const meta = dims(gpu, 1);
  const base = { dims: meta.dims, x: zeros(gpu, 32), y: zeros(gpu, 64), rowsField: DIM_ROWS };
  const rope = {
    shape: { qDim: 8, kvDim: 4, headDim: 4, ropeDim: 4 },
    rows: meta.rows,
    table: zeros(gpu, 64),
    kCache: zeros(gpu, 64),
    vCache: zeros(gpu, 64),
  };
  for (
    const t of [
      { ...base, epilogue: "rope" as const, layout: "lane" as const },
      { ...base, epilogue: "rope" as const, layout: "split" as const },
      { ...base, epilogue: "store" as const, layout: "split" as const, rope },
    ]
  ) {
    let error: Error | undefined;
    try {
      createMatmul(gpu, m, t);
    } catch (e) {
      error = e as Error;
    }
    assert(
      error?.message.includes(
        "the rope epilogue needs target.rope, and target.rope the rope epilogue",
      ),
      String(error),
    );
  }
});

Deno.test("uploadMatrix() refuses rows that are not whole blocks of the type, naming the shape", async () => {
  const gpu = await testGpu();
  // 128-wide rows: whole Q5_0 blocks (32), not Q4_K ones (256).
  const data = new Uint8Array(2 * 144);
  let error: Error | undefined;
  try {
    uploadMatrix(gpu, { name: "w", type: "q4_k", shape: [4, 128], data });
  } catch (e) {
    error = e as Error;
  }
  assert(
    error?.message.includes(
      "inner dimension to be a multiple of 256 for type q4_k, received shape [4, 128]",
    ),
    String(error),
  );
});

// Head shapes: stories260K's (8 query heads over 4 KV heads of 8) and 4 heads over 1 of 40.
for (const [nHeads, nKvHeads, headDim] of [[8, 4, 8], [4, 1, 40]] as const) {
  Deno.test(`createMatmul() with attention as its prologue adds W · the reference paged attention to y, for a prefill chunk and decodes (${nHeads}q/${nKvHeads}kv heads of ${headDim})`, async () => {
    const gpu = await testGpu();
    const blockSize = 4;
    const numBlocks = 30;
    const qDim = nHeads * headDim;
    const kvDim = nKvHeads * headDim;
    const stride = qDim + 2 * kvDim;
    const outputs = 100; // two lane workgroups of outputs, each attending for itself
    const rand = rng(headDim + 1);
    const cache = new PagedKvCache(1, nKvHeads, headDim, { numBlocks, blockSize });
    cache.key(0).set(randomF32(rand, cache.key(0).length, 2));
    cache.value(0).set(randomF32(rand, cache.value(0).length));
    const tableA = Array.from({ length: 12 }, (_, i) => (i * 7 + 3) % numBlocks);
    const tableB = [29, 1];
    const seqs = [
      { tableOffset: 0, tableLength: tableA.length, lastRow: 0 },
      { tableOffset: tableA.length, tableLength: 2, lastRow: 0 },
    ];
    // A chunk of sequence 0 at positions 30..39 (two row tiles, the second partial), then decodes.
    const rows = [
      ...Array.from({ length: 10 }, (_, i) => ({ token: 0, pos: 30 + i, seq: 0, slot: 0 })),
      { token: 0, pos: 6, seq: 1, slot: 0 },
      { token: 0, pos: 0, seq: 1, slot: 0 },
    ];
    const qkv = randomF32(rand, rows.length * stride, 2);
    const y0 = randomF32(rand, rows.length * outputs);
    const wt = randomTensor(rand, "f32", outputs, qDim);
    const meta = stepMeta(gpu, { rows, seqs, samples: [], blockTables: [...tableA, ...tableB] });
    const y = storage(gpu, y0);
    const op = createMatmul(gpu, uploadMatrix(gpu, wt), {
      dims: meta.dims,
      x: storage(gpu, qkv),
      y,
      rowsField: DIM_ROWS,
      epilogue: "accumulate",
      attention: {
        shape: { config: { nHeads, nKvHeads, headDim }, blockSize, kvDtype: "f32" },
        rows: meta.rows,
        seqs: meta.seqs,
        tables: meta.tables,
        kCache: storage(gpu, cache.key(0)),
        vCache: storage(gpu, cache.value(0)),
      },
      layout: "lane",
    });
    await runPass(gpu, (pass) => op.encode(pass, rows.length));
    const got = await readF32(gpu, y, rows.length * outputs);
    const w = dequantize(wt);
    const tables = [tableA, tableB];
    rows.forEach((r, i) => {
      const att = pagedAttention(
        new Float32Array(qDim),
        qkv.subarray(i * stride, i * stride + qDim),
        cache,
        0,
        tables[r.seq]!,
        r.pos,
        nHeads,
      );
      const want = matvec(new Float32Array(outputs), w, att).map((v, o) =>
        v + y0[i * outputs + o]!
      );
      const err = relativeError(got.subarray(i * outputs, (i + 1) * outputs), want);
      assertLess(err, 1e-5, `row ${i} (seq ${r.seq}, pos ${r.pos}): relative error ${err}`);
    });
  });
}

for (const layout of ["lane", "split"] as const) {
  Deno.test(`createMatmul() rope epilogue (${layout}) with a q | k | v bias, as two matmuls (q|k in q8_0, v in f32 at its offset), adds the bias before rotating like the reference`, async () => {
    const gpu = await testGpu();
    const [dim, ropeDim] = [64, 8];
    const { nHeads, nKvHeads, headDim } = ROPE_HEADS;
    const qDim = nHeads * headDim;
    const kvDim = nKvHeads * headDim;
    const stride = qDim + 2 * kvDim;
    const config = ropeConfig("qwen2", dim, ropeDim);
    const rand = rng(77);
    const wqk = randomTensor(rand, "q8_0", qDim + kvDim, dim, "wqk");
    const wv = randomTensor(rand, "f32", kvDim, dim, "wv");
    const bias = randomF32(rand, stride, 2);
    const x = randomF32(rand, 11 * dim, 2);
    const normW = randomF32(rand, dim);
    const rows = ropeRows();
    const meta = stepMeta(gpu, { rows, seqs: [], samples: [], blockTables: [] });
    const y = zeros(gpu, rows.length * stride * 4);
    const kc = zeros(gpu, 40 * kvDim * 4);
    const vc = zeros(gpu, 40 * kvDim * 4);
    const table = uploadRopeTable(gpu, config, config.contextLength);
    const xb = storage(gpu, x);
    const nw = storage(gpu, normW);
    const bb = storage(gpu, bias);
    const ops = [[wqk, 0], [wv, qDim + kvDim]] as const;
    await runPass(gpu, (pass) => {
      for (const [w, yOffset] of ops) {
        createMatmul(gpu, uploadMatrix(gpu, w), {
          dims: meta.dims,
          x: xb,
          y,
          yStride: stride,
          yOffset,
          rowsField: DIM_ROWS,
          norm: { weight: nw, eps: 1e-5 },
          epilogue: "rope",
          rope: {
            shape: { qDim, kvDim, headDim, ropeDim, bias: true },
            rows: meta.rows,
            table,
            kCache: kc,
            vCache: vc,
            bias: bb,
          },
          layout,
        }).encode(pass, rows.length);
      }
    });
    const gotY = await readF32(gpu, y, rows.length * stride);
    const gotK = await readF32(gpu, kc, 40 * kvDim);
    const gotV = await readF32(gpu, vc, 40 * kvDim);
    const dense = new Float32Array(stride * dim);
    dense.set(dequantize(wqk), 0);
    dense.set(dequantize(wv), (qDim + kvDim) * dim);
    assertRopeRows({ y: gotY, k: gotK, v: gotV }, rows, { dense, x, normW, dim, ropeDim, bias });
  });
}

for (const [type, outF, inF] of [["f32", 64, 172], ["q8_0", 32, 64]] as const) {
  Deno.test(`createMatmul() with the final norm in its epilogue (${type}, ${outF} outputs) adds W·x to y and writes rmsnorm(new y) of each sampled row, in sample order`, async () => {
    const gpu = await testGpu();
    const rand = rng(outF + inF);
    const w = randomTensor(rand, type, outF, inF, "down");
    const normW = randomF32(rand, outF);
    const eps = 1e-5;
    for (const [rows, sampled] of [[1, [0]], [11, [9, 2, 10]], [3, []]] as const) {
      const x = randomF32(rand, rows * inF, 2);
      const y0 = randomF32(rand, rows * outF);
      const meta = dims(gpu, rows, [...sampled]);
      const y = storage(gpu, y0);
      const out = zeros(gpu, Math.max(1, sampled.length) * outF * 4);
      const op = createMatmul(gpu, uploadMatrix(gpu, w), {
        dims: meta.dims,
        rowsField: DIM_ROWS,
        x: storage(gpu, x),
        y,
        epilogue: "accumulate",
        finalNorm: { weight: storage(gpu, normW), eps, samples: meta.samples, out },
        layout: "lane",
      });
      await runPass(gpu, (pass) => op.encode(pass, rows));
      const got = await readF32(gpu, y, rows * outF);
      const dense = dequantize(w);
      const want = new Float32Array(rows * outF);
      for (let r = 0; r < rows; r++) {
        const o = matvec(new Float32Array(outF), dense, x.slice(r * inF, (r + 1) * inF));
        for (let j = 0; j < outF; j++) want[r * outF + j] = y0[r * outF + j]! + o[j]!;
      }
      assertLess(relativeError(got, want), 1e-5, `${rows} rows: y`);
      if (sampled.length === 0) continue;
      const normed = await readF32(gpu, out, sampled.length * outF);
      const wantNorm = new Float32Array(sampled.length * outF);
      sampled.forEach((r, i) => {
        const row = rmsnorm(
          new Float32Array(outF),
          want.slice(r * outF, (r + 1) * outF),
          normW,
          eps,
        );
        wantNorm.set(row, i * outF);
      });
      const err = relativeError(normed, wantNorm);
      assertLess(err, 1e-5, `${rows} rows, samples ${sampled}: relative error ${err}`);
    }
  });
}

Deno.test("lane matmuls share activations by subgroupBroadcast on a CPU rasterizer's 8-wide subgroups, with the same bits as every lane loading them", async () => {
  const gpu = await testGpu();
  // The suite's WebGPU is lavapipe (subgroups of exactly 8); a real GPU runs the split layout.
  // Granted where the adapter says its subgroups are always the lane kernels' 8 lanes (lavapipe
  // on Vulkan); OpenGL ES offers none, and there both paths load (the reference still checks).
  const adapter = await requestDefaultAdapter();
  assertEquals(
    gpu.laneSubgroups,
    adapter !== null && laneSubgroupsFit(adapter.info),
    "subgroups granted for the lane kernels",
  );
  const loads: Gpu = { ...gpu, laneSubgroups: false };
  const cases: Omit<Case, "seed" | "layout">[] = [
    { type: "q8_0", outF: 40, inF: 256, rows: 1, norm: true },
    { type: "q5_0", outF: 24, inF: 96, rows: 3, epilogue: "swiglu", norm: true },
    { type: "q4_0", outF: 17, inF: 64, rows: 19, epilogue: "accumulate" },
    { type: "q4_k", outF: 33, inF: 512, rows: 8, norm: true, gather: [5, 0, 7] },
    { type: "q6_k", outF: 9, inF: 256, rows: 2, epilogue: "swiglu" },
    // Q6_K without a norm or a pair: the half-block loop the down projections take.
    { type: "q6_k", outF: 19, inF: 512, rows: 3, epilogue: "accumulate" },
  ];
  for (const [i, c] of cases.entries()) {
    const [shared] = await compare(gpu, { ...c, seed: 100 + i, layout: "lane" });
    const [loaded, want] = await compare(loads, { ...c, seed: 100 + i, layout: "lane" });
    assertEquals(shared, loaded, `${c.type} ${c.epilogue ?? "store"} x ${c.rows} rows`);
    assertLess(relativeError(shared, want), 1e-5, `${c.type} against the CPU reference`);
  }
});
