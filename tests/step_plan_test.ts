import { assertEquals, assertThrows } from "@std/assert";
import { GREEDY, type SeqInput } from "../lib/engine/engine.ts";
import type { ModelConfig } from "../lib/model/model_config.ts";
import { planStep, type SlotLookup } from "../kernels/webgpu/step_plan.ts";
import { LAST_SAMPLED_FLAG, SAMPLE_WORDS, StepMetaLayout } from "../kernels/webgpu/step_meta.ts";

const CONFIG: ModelConfig = {
  architecture: "llama",
  dim: 8,
  hiddenDim: 16,
  nLayers: 1,
  nHeads: 1,
  nKvHeads: 1,
  headDim: 8,
  vocabSize: 100,
  contextLength: 64,
  ropeTheta: 10000,
  ropeDim: 8,
  rmsEps: 1e-5,
};
const KV = { numBlocks: 10, blockSize: 4 };
const CAPACITY = { maxRows: 16, maxSeqs: 4, maxTableEntries: 16 };

/** A device table of `size` last-sampled slots, least recently used evicted first. */
function slots(
  size: number,
  held: Record<number, number> = {},
): SlotLookup & { map: Map<number, number> } {
  const map = new Map(Object.entries(held).map(([k, v]) => [Number(k), v]));
  const lookup = (seqId: number, create: boolean) => {
    const s = map.get(seqId);
    if (s !== undefined) {
      map.delete(seqId);
      map.set(seqId, s);
      return s;
    }
    if (!create) return undefined;
    const used = new Set(map.values());
    let free = [...Array(size).keys()].find((i) => !used.has(i));
    if (free === undefined) {
      const [oldest, slot] = map.entries().next().value!;
      map.delete(oldest);
      free = slot;
    }
    map.set(seqId, free);
    return free;
  };
  return Object.assign(lookup, { map });
}

const seq = (p: Partial<SeqInput>): SeqInput => ({
  seqId: 1,
  tokens: [7],
  startPos: 0,
  blockTable: [0],
  sample: true,
  sampling: GREEDY,
  ...p,
});

Deno.test("planStep flattens a prefill chunk and a decode into rows, sequences, samples and tables", () => {
  const sampling = { temperature: 0.5, topK: 3, topP: 0.9, minP: 0.1, seed: 2 ** 32 + 5 };
  const p = planStep(
    {
      stepId: 0,
      seqs: [
        // Positions 3..5 of a sequence whose table is [6, 2]: 3 is block 6 slot 3, 4-5 block 2.
        seq({ seqId: 1, tokens: [11, 12, 13], startPos: 3, blockTable: [6, 2, 9], sample: false }),
        seq({
          seqId: 2,
          tokens: [],
          useLastSampled: true,
          startPos: 4,
          blockTable: [1, 5],
          sampling,
        }),
      ],
    },
    CONFIG,
    KV,
    CAPACITY,
    slots(4, { 2: 3 }),
  );
  // Written by hand: slot = block * 4 + pos % 4.
  assertEquals(p.content.rows, [
    { token: 11, pos: 3, seq: 0, slot: 6 * 4 + 3 },
    { token: 12, pos: 4, seq: 0, slot: 2 * 4 + 0 },
    { token: 13, pos: 5, seq: 0, slot: 2 * 4 + 1 },
    { token: LAST_SAMPLED_FLAG | 3, pos: 4, seq: 1, slot: 5 * 4 + 0 },
  ]);
  // Only the blocks the positions need: [6, 2] (not 9) and [1, 5].
  assertEquals(Array.from(p.content.blockTables), [6, 2, 1, 5]);
  assertEquals(p.content.seqs, [
    { tableOffset: 0, tableLength: 2, lastRow: 2 },
    { tableOffset: 2, tableLength: 2, lastRow: 3 },
  ]);
  assertEquals(p.sampledSeqIds, [2]);
  assertEquals(p.content.samples, [{
    row: 3,
    lastSlot: 3, // it samples into the slot it read from
    seed: 5, // the low 32 bits
    position: 5,
    temperature: 0.5,
    topK: 3,
    topP: 0.9,
    minP: 0.1,
  }]);
});

Deno.test("planStep names the token rows whose hidden states come back: all of a chunk's, or its last", () => {
  const p = planStep(
    {
      stepId: 0,
      seqs: [
        seq({ seqId: 1, tokens: [5, 6], startPos: 0, blockTable: [0], sample: true }),
        seq({ seqId: 2, tokens: [7, 8, 9], startPos: 4, blockTable: [1, 2], hidden: "all" }),
        seq({ seqId: 3, tokens: [3, 4, 5, 6], startPos: 0, blockTable: [3], hidden: "last" }),
      ],
    },
    CONFIG,
    KV,
    CAPACITY,
    slots(4),
  );
  // Rows 0-1 are sequence 1's, 2-4 sequence 2's (positions 4-6), 5-8 sequence 3's.
  assertEquals(p.hidden, [
    { seqId: 2, startPos: 4, row: 2, count: 3 },
    { seqId: 3, startPos: 3, row: 8, count: 1 },
  ]);
});

Deno.test("planStep claims new last-sampled slots only after every lookup, never evicting one the plan reads", () => {
  // A table of 2 slots holding sequences 1 and 2. Sequence 3 samples (needs a slot) and is
  // listed before sequence 1's decode, which reads slot 0: the eviction must take sequence 2's.
  const table = slots(2, { 1: 0, 2: 1 });
  const p = planStep(
    {
      stepId: 1,
      seqs: [
        seq({ seqId: 3, tokens: [5], blockTable: [3] }),
        seq({ seqId: 1, tokens: [], useLastSampled: true, startPos: 1, blockTable: [4] }),
      ],
    },
    CONFIG,
    KV,
    CAPACITY,
    table,
  );
  assertEquals(p.content.rows[1]!.token, LAST_SAMPLED_FLAG | 0);
  assertEquals(p.content.samples.map((s) => s.lastSlot), [1, 0]);
  assertEquals([...table.map.keys()].sort(), [1, 3], "sequence 2 lost its slot, not 1");
});

Deno.test("planStep refuses a bad plan before claiming any slot", () => {
  const table = slots(4);
  assertThrows(
    () =>
      planStep(
        {
          stepId: 2,
          seqs: [seq({ seqId: 1 }), seq({ seqId: 2, tokens: [100] })],
        },
        CONFIG,
        KV,
        CAPACITY,
        table,
      ),
    Error,
    "sequence 2 has token 100 outside the vocabulary 0..99",
  );
  assertEquals(table.map.size, 0);
});

Deno.test("StepMetaLayout packs each section at its aligned offset, little-endian", () => {
  const layout = new StepMetaLayout(CAPACITY);
  for (const off of Object.values(layout.offsets)) assertEquals(off % 256, 0);
  const p = planStep(
    {
      stepId: 0,
      seqs: [seq({ tokens: [9, 8], blockTable: [7], sampling: { ...GREEDY, temperature: 0.25 } })],
    },
    CONFIG,
    KV,
    CAPACITY,
    slots(2),
  );
  const region = new DataView(new ArrayBuffer(layout.bytes));
  const ranges = layout.pack(region, p.content);
  const u32 = (at: number) => region.getUint32(at, true);
  assertEquals([u32(0), u32(4), u32(8)], [2, 1, 1], "rows, samples, sequences");
  const rows = layout.offsets.rows;
  assertEquals([u32(rows), u32(rows + 4), u32(rows + 8), u32(rows + 12)], [9, 0, 0, 28]);
  assertEquals([u32(rows + 16), u32(rows + 20), u32(rows + 28)], [8, 1, 29]);
  const seqs = layout.offsets.seqs;
  assertEquals([u32(seqs), u32(seqs + 4), u32(seqs + 8)], [0, 1, 1]);
  const s = layout.offsets.samples;
  assertEquals([u32(s), u32(s + 12)], [1, 2], "last row, position of the sampled token");
  assertEquals(region.getFloat32(s + 16, true), 0.25);
  assertEquals(u32(layout.offsets.tables), 7);
  assertEquals(ranges, [
    [layout.offsets.dims, 16],
    [rows, 2 * 16],
    [seqs, 16],
    [s, SAMPLE_WORDS * 4],
    [layout.offsets.tables, 4],
  ]);
  assertThrows(
    () =>
      layout.pack(region, {
        ...p.content,
        rows: Array(17).fill(p.content.rows[0]),
      }),
    Error,
    "capacity is 16 rows",
  );
});
