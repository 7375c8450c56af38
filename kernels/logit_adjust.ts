import type { Gpu, KernelOp } from "./device.ts";
import type { LogitAdjust } from "../lib/engine/logit_adjust.ts";

/** u32 words of one entry: sample row, token id, bias, penalty, subtract. */
const ENTRY_WORDS = 5;
const HEADER_BYTES = 4;
const THREADS = 64;
const ALIGN = 256; // minStorageBufferOffsetAlignment on most GPUs

/**
 * lib/engine/logit_adjust.ts on the device: one thread per listed (row, token), in place on the
 * logits buffer after the classifier and before the sampler. Entries of one step never name a
 * (row, token) twice, so threads never race.
 */
export function logitAdjustWgsl(vocab: number): string {
  return /* wgsl */ `
struct Entry { row: u32, token: u32, bias: f32, penalty: f32, subtract: f32 }
struct Adjusts { count: u32, entries: array<Entry> }
@group(0) @binding(0) var<storage, read> adj: Adjusts;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
const V = ${vocab}u;

@compute @workgroup_size(${THREADS})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i >= adj.count) { return; }
  let e = adj.entries[i];
  let at = e.row * V + e.token;
  let x = logits[at] + e.bias;
  let p = select(x * e.penalty, x / e.penalty, x > 0.0);
  logits[at] = p - e.subtract;
}
`;
}

/** One plan's entries as packed: where its region starts in the submit's buffer and how many. */
interface Region {
  readonly offset: number;
  readonly bytes: number;
  readonly count: number;
}

/**
 * The logit-adjust kernel of one engine. Each submit packs every plan's entries into one
 * buffer (a 256-byte-aligned region each, written once before the submit); `use(i)` points the
 * op at plan i's region before that plan's kernels are encoded. The buffer grows as needed; a
 * replaced one is kept until dispose, since steps already submitted may still read it.
 */
export class LogitAdjustOp implements KernelOp {
  readonly label = "logit adjust";
  readonly #gpu: Gpu;
  readonly #pipeline: GPUComputePipeline;
  readonly #logits: GPUBuffer;
  #buffer: GPUBuffer | undefined;
  readonly #retired: GPUBuffer[] = [];
  #regions: (Region | undefined)[] = [];
  #group: GPUBindGroup | undefined;
  #count = 0;

  constructor(gpu: Gpu, vocab: number, logits: GPUBuffer) {
    this.#gpu = gpu;
    this.#logits = logits;
    this.#pipeline = gpu.pipeline(logitAdjustWgsl(vocab), this.label);
  }

  /**
   * Packs the adjustments of each plan of one submit (per plan, its sampled rows' adjustments in
   * row order, undefined for a row without) and uploads them.
   */
  prepare(plans: readonly (readonly (LogitAdjust | undefined)[])[]): void {
    this.#regions = [];
    let total = 0;
    const counts = plans.map((rows) => rows.reduce((n, a) => n + (a?.ids.length ?? 0), 0));
    const regions = counts.map((count) => {
      if (count === 0) return undefined;
      const bytes = HEADER_BYTES + count * ENTRY_WORDS * 4;
      const r = { offset: total, bytes, count };
      total += Math.ceil(bytes / ALIGN) * ALIGN;
      return r;
    });
    if (total === 0) return;
    const data = new ArrayBuffer(total);
    const u32 = new Uint32Array(data), f32 = new Float32Array(data);
    plans.forEach((rows, p) => {
      const region = regions[p];
      if (region === undefined) return;
      let w = region.offset / 4;
      u32[w++] = region.count;
      rows.forEach((a, row) => {
        if (a === undefined) return;
        for (let i = 0; i < a.ids.length; i++) {
          u32[w] = row;
          u32[w + 1] = a.ids[i]!;
          f32[w + 2] = a.bias[i]!;
          f32[w + 3] = a.penalty[i]!;
          f32[w + 4] = a.subtract[i]!;
          w += ENTRY_WORDS;
        }
      });
    });
    this.#ensure(total);
    this.#gpu.device.queue.writeBuffer(this.#buffer!, 0, data);
    this.#regions = regions;
  }

  /** Points the next encode at plan `i` of the last prepare() (nothing to do when it has none). */
  use(i: number): void {
    const r = this.#regions[i];
    this.#count = r?.count ?? 0;
    this.#group = r === undefined ? undefined : this.#gpu.device.createBindGroup({
      layout: this.#pipeline.getBindGroupLayout(0),
      entries: [
        { binding: 0, resource: { buffer: this.#buffer!, offset: r.offset, size: r.bytes } },
        { binding: 1, resource: { buffer: this.#logits } },
      ],
      label: this.label,
    });
  }

  encode(pass: GPUComputePassEncoder): void {
    if (this.#count === 0 || this.#group === undefined) return;
    pass.setPipeline(this.#pipeline);
    pass.setBindGroup(0, this.#group);
    pass.dispatchWorkgroups(Math.ceil(this.#count / THREADS));
  }

  cost() {
    return { flops: 4 * this.#count, bytes: this.#count * (ENTRY_WORDS * 4 + 8) };
  }

  /** Frees its buffers (the engine's `owned` list calls this). */
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
      label: "logit adjustments",
    });
  }
}
