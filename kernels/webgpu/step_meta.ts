import type { StepCapacity } from "../../lib/engine/step_validation.ts";

/**
 * The per-step metadata the kernels read: one buffer with fixed sections (so bind groups are
 * made once), filled by a copy at the start of each step's commands. Several steps can share
 * one submit because each copies its own region of a staging buffer.
 */

/** A token row's input is "the last token sampled into slot s" when this bit is set. */
export const LAST_SAMPLED_FLAG = 0x80000000;

/** Field of `dims` holding each count. */
export const DIM_ROWS = 0;
export const DIM_SAMPLES = 1;
export const DIM_SEQS = 2;

export const ROW_WORDS = 4;
export const SEQ_WORDS = 4;
export const SAMPLE_WORDS = 8;

/** WGSL view of the sections. */
export const WGSL_STEP_TYPES = /* wgsl */ `
struct Row { token: u32, pos: u32, seq: u32, slot: u32 }
struct Seq { tableOffset: u32, tableLength: u32, lastRow: u32, unused: u32 }
struct Sample {
  row: u32, lastSlot: u32, seed: u32, position: u32,
  temperature: f32, topK: u32, topP: f32, minP: f32,
}
`;

/** One token row of a step. */
export interface RowMeta {
  /** A token id, or LAST_SAMPLED_FLAG | slot. */
  readonly token: number;
  readonly pos: number;
  /** Index of its sequence in the step's `seqs`. */
  readonly seq: number;
  /** KV pool slot (block * blockSize + offset) the row's K/V are written to. */
  readonly slot: number;
}

export interface SeqMeta {
  readonly tableOffset: number;
  readonly tableLength: number;
  readonly lastRow: number;
}

/** One sequence to sample from, with its sampling parameters. */
export interface SampleMeta {
  readonly row: number;
  /** Slot of the last-sampled-token table this sequence writes. */
  readonly lastSlot: number;
  readonly seed: number;
  /** Position the sampled token will occupy (the RNG counter). */
  readonly position: number;
  readonly temperature: number;
  readonly topK: number;
  readonly topP: number;
  readonly minP: number;
}

export interface StepContent {
  readonly rows: readonly RowMeta[];
  readonly seqs: readonly SeqMeta[];
  readonly samples: readonly SampleMeta[];
  readonly blockTables: ArrayLike<number>;
}

type Section = "dims" | "rows" | "seqs" | "samples" | "tables";

/** Capacities of one step, which fix the section offsets. */
export type { StepCapacity };

const ALIGN = 256; // minStorageBufferOffsetAlignment on most GPUs

/** Section offsets for a capacity, and packing of a step into a staging region. */
export class StepMetaLayout {
  readonly offsets: Record<Section, number>;
  readonly sizes: Record<Section, number>;
  readonly bytes: number;

  constructor(readonly capacity: StepCapacity) {
    const sizes: Record<Section, number> = {
      dims: 16,
      rows: capacity.maxRows * ROW_WORDS * 4,
      seqs: capacity.maxSeqs * SEQ_WORDS * 4,
      samples: capacity.maxSeqs * SAMPLE_WORDS * 4,
      tables: Math.max(1, capacity.maxTableEntries) * 4,
    };
    const offsets = {} as Record<Section, number>;
    let at = 0;
    for (const s of ["dims", "rows", "seqs", "samples", "tables"] as const) {
      offsets[s] = at;
      at += Math.ceil(sizes[s] / ALIGN) * ALIGN;
    }
    this.offsets = offsets;
    this.sizes = sizes;
    this.bytes = at;
  }

  /** Bindings of each section of a live meta buffer. */
  bindings(meta: GPUBuffer): Record<Section, GPUBufferBinding> {
    const b = (s: Section): GPUBufferBinding => ({
      buffer: meta,
      offset: this.offsets[s],
      size: this.sizes[s],
    });
    return {
      dims: b("dims"),
      rows: b("rows"),
      seqs: b("seqs"),
      samples: b("samples"),
      tables: b("tables"),
    };
  }

  /**
   * Writes a step into `region` (this.bytes long) and returns the byte ranges worth copying
   * [offset, length] (unused tails are skipped).
   */
  pack(region: DataView, c: StepContent): [number, number][] {
    const { maxRows, maxSeqs, maxTableEntries } = this.capacity;
    if (
      c.rows.length > maxRows || c.seqs.length > maxSeqs || c.samples.length > maxSeqs ||
      c.blockTables.length > maxTableEntries
    ) {
      throw new Error(
        `Cannot pack step: it needs ${c.rows.length} rows, ${c.seqs.length} sequences, ${c.samples.length} samples and ${c.blockTables.length} block-table entries; capacity is ${maxRows} rows, ${maxSeqs} sequences, ${maxTableEntries} entries`,
      );
    }
    const o = this.offsets;
    const u32 = (at: number, v: number) => region.setUint32(at, v >>> 0, true);
    u32(DIM_ROWS * 4, c.rows.length);
    u32(DIM_SAMPLES * 4, c.samples.length);
    u32(DIM_SEQS * 4, c.seqs.length);
    u32(12, 0);
    // A Row and a Seq are four u32 words each, in WGSL_STEP_TYPES' field order.
    const words = (at: number, w0: number, w1: number, w2: number, w3: number) => {
      u32(at, w0);
      u32(at + 4, w1);
      u32(at + 8, w2);
      u32(at + 12, w3);
    };
    c.rows.forEach((r, i) => words(o.rows + i * ROW_WORDS * 4, r.token, r.pos, r.seq, r.slot));
    c.seqs.forEach((s, i) =>
      words(o.seqs + i * SEQ_WORDS * 4, s.tableOffset, s.tableLength, s.lastRow, 0)
    );
    c.samples.forEach((s, i) => {
      const at = o.samples + i * SAMPLE_WORDS * 4;
      u32(at, s.row);
      u32(at + 4, s.lastSlot);
      u32(at + 8, s.seed);
      u32(at + 12, s.position);
      region.setFloat32(at + 16, s.temperature, true);
      u32(at + 20, s.topK);
      region.setFloat32(at + 24, s.topP, true);
      region.setFloat32(at + 28, s.minP, true);
    });
    for (let i = 0; i < c.blockTables.length; i++) u32(o.tables + i * 4, c.blockTables[i]!);
    const ranges: [number, number][] = [
      [o.dims, 16],
      [o.rows, c.rows.length * ROW_WORDS * 4],
      [o.seqs, c.seqs.length * SEQ_WORDS * 4],
      [o.samples, c.samples.length * SAMPLE_WORDS * 4],
      [o.tables, c.blockTables.length * 4],
    ];
    return ranges.filter(([, len]) => len > 0);
  }
}
