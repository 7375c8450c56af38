import { assertLess } from "@std/assert";
import { type AttentionLayout, createAttention } from "../kernels/webgpu/attention.ts";
import type { ModelConfig } from "../lib/model/model_config.ts";
import { pagedAttention } from "../kernels/reference/paged_attention.ts";
import { PagedKvCache } from "../kernels/reference/paged_kv_cache.ts";
import {
  randomF32,
  readF32,
  relativeError,
  rng,
  runPass,
  stepMeta,
  storage,
  testGpu,
  zeros,
} from "./_gpu.ts";

function config(nHeads: number, nKvHeads: number, headDim: number): ModelConfig {
  return {
    architecture: "llama",
    dim: nHeads * headDim,
    hiddenDim: 8,
    nLayers: 1,
    nHeads,
    nKvHeads,
    headDim,
    vocabSize: 8,
    contextLength: 256,
    ropeTheta: 10000,
    ropeDim: headDim,
    rmsEps: 1e-5,
  };
}

// Head shapes: stories260K's (8 query heads over 4 KV heads of 8), wide heads, no grouping, 8 heads per KV head.
for (
  const [nHeads, nKvHeads, headDim] of [[8, 4, 8], [4, 1, 40], [2, 2, 128], [8, 1, 16]] as const
) {
  for (const layout of ["tiled", "lane"] as AttentionLayout[]) {
    Deno.test(`createAttention() ${layout} matches the reference paged attention for a prefill chunk and decodes (${nHeads}q/${nKvHeads}kv heads of ${headDim})`, async () => {
      const gpu = await testGpu();
      const cfg = config(nHeads, nKvHeads, headDim);
      const blockSize = 4;
      const numBlocks = 40;
      const rand = rng(headDim);
      const cache = new PagedKvCache(1, nKvHeads, headDim, { numBlocks, blockSize });
      cache.key(0).set(randomF32(rand, cache.key(0).length, 2));
      cache.value(0).set(randomF32(rand, cache.value(0).length));
      // Scattered, non-contiguous block tables.
      const tableA = Array.from({ length: 18 }, (_, i) => (i * 7 + 3) % numBlocks);
      const tableB = [39, 1];
      const tableC = [20];
      const seqs = [
        { tableOffset: 0, tableLength: tableA.length, lastRow: 0 },
        { tableOffset: tableA.length, tableLength: 2, lastRow: 0 },
        { tableOffset: tableA.length + 2, tableLength: 1, lastRow: 0 },
      ];
      // A chunk of sequence 0 at positions 60..69 (crossing key tiles), then decodes.
      const rows = [
        ...Array.from({ length: 10 }, (_, i) => ({ token: 0, pos: 60 + i, seq: 0, slot: 0 })),
        { token: 0, pos: 6, seq: 1, slot: 0 },
        { token: 0, pos: 0, seq: 2, slot: 0 },
        { token: 0, pos: 31, seq: 0, slot: 0 },
        { token: 0, pos: 32, seq: 0, slot: 0 },
      ];
      const qDim = nHeads * headDim;
      const kvDim = nKvHeads * headDim;
      const stride = qDim + 2 * kvDim;
      const qkv = randomF32(rand, rows.length * stride, 2);
      const meta = stepMeta(gpu, {
        rows,
        seqs,
        samples: [],
        blockTables: [...tableA, ...tableB, ...tableC],
      });
      const out = zeros(gpu, rows.length * qDim * 4);
      const op = createAttention(gpu, cfg, blockSize, {
        dims: meta.dims,
        rows: meta.rows,
        seqs: meta.seqs,
        tables: meta.tables,
        qkv: storage(gpu, qkv),
        kCache: storage(gpu, cache.key(0)),
        vCache: storage(gpu, cache.value(0)),
        out,
        layout,
      });
      await runPass(gpu, (pass) => op.encode(pass, rows.length));
      const got = await readF32(gpu, out, rows.length * qDim);
      const tables = [tableA, tableB, tableC];
      rows.forEach((r, i) => {
        const want = pagedAttention(
          new Float32Array(qDim),
          qkv.subarray(i * stride, i * stride + qDim),
          cache,
          0,
          tables[r.seq]!,
          r.pos,
          nHeads,
        );
        const err = relativeError(got.subarray(i * qDim, (i + 1) * qDim), want);
        assertLess(err, 1e-5, `row ${i} (seq ${r.seq}, pos ${r.pos}): relative error ${err}`);
      });
    });
  }
}
