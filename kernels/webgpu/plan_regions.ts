import { bindAll, type Gpu } from "./device.ts";

/** One plan's entries as packed: where its region starts in the submit's buffer, its size, how many. */
export interface Region {
  readonly offset: number;
  readonly bytes: number;
  readonly count: number;
}

/** A region starts with its entry count, one u32. */
const HEADER_BYTES = 4;
/** minStorageBufferOffsetAlignment on most GPUs: a bind group may start a region there. */
const ALIGN = 256;

/**
 * Where each plan's entries go in one submit's buffer: a u32 count, then `count` entries of
 * `entryBytes`, in a 256-byte-aligned region per plan; none for a plan without entries.
 */
export function planRegions(
  counts: readonly number[],
  entryBytes: number,
): { readonly regions: (Region | undefined)[]; readonly total: number } {
  let total = 0;
  const regions = counts.map((count) => {
    if (count === 0) return undefined;
    const bytes = HEADER_BYTES + count * entryBytes;
    const r = { offset: total, bytes, count };
    total += Math.ceil(bytes / ALIGN) * ALIGN;
    return r;
  });
  return { regions, total };
}

/**
 * The per-submit request buffer of a kernel that runs once per plan (logit adjustments, top
 * logprobs): each submit packs every plan's entries into it, a region each, written once
 * before the submit; `region(i)` is what plan i's bind group names. The buffer grows as
 * needed; a replaced one is kept until destroy(), since steps already submitted may still read
 * it.
 */
export class PlanRegions {
  readonly #gpu: Gpu;
  readonly #label: string;
  #buffer: GPUBuffer | undefined;
  readonly #retired: GPUBuffer[] = [];
  #regions: (Region | undefined)[] = [];

  constructor(gpu: Gpu, label: string) {
    this.#gpu = gpu;
    this.#label = label;
  }

  /**
   * Lays out one submit's plans (`counts[p]` entries of `entryBytes` each), writes each region's
   * count and lets `fill` write plan p's entries from u32 word `word` of `data`, then uploads.
   */
  write(
    counts: readonly number[],
    entryBytes: number,
    fill: (data: ArrayBuffer, plan: number, word: number) => void,
  ): void {
    const { regions, total } = planRegions(counts, entryBytes);
    this.#regions = regions;
    if (total === 0) return;
    const data = new ArrayBuffer(total);
    const u32 = new Uint32Array(data);
    regions.forEach((r, p) => {
      if (r === undefined) return;
      u32[r.offset / 4] = r.count;
      fill(data, p, r.offset / 4 + 1);
    });
    this.#ensure(total);
    this.#gpu.device.queue.writeBuffer(this.#buffer!, 0, data);
  }

  /** Plan i's entry count and its binding, or undefined when it has none. */
  region(i: number): { readonly count: number; readonly binding: GPUBufferBinding } | undefined {
    const r = this.#regions[i];
    if (r === undefined) return undefined;
    return { count: r.count, binding: { buffer: this.#buffer!, offset: r.offset, size: r.bytes } };
  }

  /**
   * Plan i's entry count, and the bind group of `pipeline` that names its region at binding 0
   * and `buffers` after it (none when the plan has no entries).
   */
  bind(
    i: number,
    pipeline: GPUComputePipeline,
    buffers: readonly GPUBuffer[],
    label: string,
  ): { readonly count: number; readonly group: GPUBindGroup | undefined } {
    const r = this.region(i);
    if (r === undefined) return { count: 0, group: undefined };
    return { count: r.count, group: bindAll(this.#gpu, pipeline, [r.binding, ...buffers], label) };
  }

  destroy(): void {
    this.#buffer?.destroy();
    for (const b of this.#retired) b.destroy();
    this.#retired.length = 0;
    this.#buffer = undefined;
  }

  #ensure(bytes: number): void {
    if (this.#buffer !== undefined && this.#buffer.size >= bytes) return;
    if (this.#buffer !== undefined) this.#retired.push(this.#buffer);
    let size = Math.max(4096, this.#buffer?.size ?? 0);
    while (size < bytes) size *= 2;
    this.#buffer = this.#gpu.device.createBuffer({
      size,
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
      label: this.#label,
    });
  }
}
